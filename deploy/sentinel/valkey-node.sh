#!/bin/sh
# Start one Valkey data node of a Sentinel group (compose.sentinel.yaml, k8s/sentinel/).
# A node (re)starting asks the sentinels which node is the master now, and joins it as
# a replica; only when no sentinel knows one (first start of the group) does
# $INITIAL_PRIMARY start as the master and the others as its replicas. So a primary that
# crashed and was failed over comes back as the new primary's replica, never as a
# second master holding stale queues (jobs sent twice, or lost).
# Env: SENTINELS ("host:port host:port ..."), MASTER_NAME, INITIAL_PRIMARY (host),
#      SELF (this node's host name, as the others reach it), VALKEY_REPLICA_PASSWORD,
#      VALKEY_SENTINEL_PASSWORD (optional: the sentinels' own password).
set -eu
master=""
for s in $SENTINELS; do
  reply=$(valkey-cli -h "${s%:*}" -p "${s#*:}" ${VALKEY_SENTINEL_PASSWORD:+--pass "$VALKEY_SENTINEL_PASSWORD"} \
          --no-auth-warning --raw sentinel get-master-addr-by-name "$MASTER_NAME" 2>/dev/null \
          | tr '\n' ' ') || true
  set -- $reply
  if [ "$#" -eq 2 ]; then master="$1 $2"; break; fi
done
if [ -z "$master" ] && [ "$SELF" != "$INITIAL_PRIMARY" ]; then master="$INITIAL_PRIMARY 6379"; fi
set -- valkey-server /etc/valkey/valkey.conf --replica-announce-ip "$SELF" \
  --masteruser replica --masterauth "$VALKEY_REPLICA_PASSWORD"
if [ -n "$master" ] && [ "${master% *}" != "$SELF" ]; then
  set -- "$@" --replicaof ${master% *} ${master#* }
fi
exec "$@"
