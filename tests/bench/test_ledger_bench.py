"""Ledger benchmark: reserve+commit pairs per second with 16 concurrent clients.

The baseline in the same run is a plain Redis round trip pair (two PINGs), so the
ratio shows what the Lua scripts cost on top of the network.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor

from service.storage import rkeys
from service.storage.ledger import Ledger, Reservation

CLIENTS = 16
SECONDS = 5.0


def _rate(redis_url: str, work: str) -> float:
    ds = "ds_bench_" + secrets.token_hex(4)
    Ledger(rkeys.connect(redis_url)).open(ds, {"epsilon": 10**15}, "bench")
    deadline = time.monotonic() + SECONDS

    def client(c: int) -> int:
        conn = rkeys.connect(redis_url)
        ledger = Ledger(conn)
        n = 0
        while time.monotonic() < deadline:
            if work == "ping":
                conn.ping()
                conn.ping()
            else:
                rid = f"rel_{ds}_{c}_{n}"
                ledger.reserve(Reservation(ds, rid, {"epsilon": 1}, actor="bench",
                               fingerprint=rid, request_json="{}", replay=False))
                run = ledger.mark_running(rid, "bench")
                assert run is not None
                ledger.commit(ds, run, "{}")
            n += 1
        return n

    start = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        total = sum(pool.map(client, range(CLIENTS)))
    return total / (time.monotonic() - start)


def test_ledger_reserve_commit_rate(redis_url: str) -> None:
    pings = _rate(redis_url, "ping")
    pairs = _rate(redis_url, "ledger")
    print(f"\nledger reserve+commit pairs/s with {CLIENTS} clients: {pairs:.0f} "
          f"(two-PING baseline {pings:.0f}/s, ratio {pairs / pings:.2f})")
    assert pairs > 100
