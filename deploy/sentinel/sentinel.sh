#!/bin/sh
# Start one sentinel (compose.sentinel.yaml, k8s/sentinel/). Sentinels rewrite their
# config file with what they learn (the current master, the epoch), so it is written
# from the environment only once, into the sentinel's own volume, and kept after that.
# Env: MASTER_NAME, INITIAL_PRIMARY (host), SELF (this sentinel's host name),
#      VALKEY_SENTINEL_USER_PASSWORD (the data nodes' `sentinel` ACL user),
#      VALKEY_SENTINEL_PASSWORD (optional: clients and sentinels authenticate to sentinels).
set -eu
conf=/data/sentinel.conf
if [ ! -s "$conf" ]; then
  cat > "$conf" <<CONF
port 26379
dir /data
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $SELF
sentinel monitor $MASTER_NAME $INITIAL_PRIMARY 6379 2
sentinel auth-user $MASTER_NAME sentinel
sentinel auth-pass $MASTER_NAME $VALKEY_SENTINEL_USER_PASSWORD
sentinel down-after-milliseconds $MASTER_NAME 5000
sentinel failover-timeout $MASTER_NAME 60000
sentinel parallel-syncs $MASTER_NAME 1
CONF
  if [ -n "${VALKEY_SENTINEL_PASSWORD:-}" ]; then
    printf 'requirepass %s\nsentinel sentinel-pass %s\n' "$VALKEY_SENTINEL_PASSWORD" \
      "$VALKEY_SENTINEL_PASSWORD" >> "$conf"
  fi
fi
exec valkey-server "$conf" --sentinel
