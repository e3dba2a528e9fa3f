"""The privacy budget ledger: reserve, commit, abort — each one Lua script.

All amounts are integer units (see ``service.budget``). The scripts run
atomically inside Redis, so any number of API processes and workers on any
number of hosts can never hold or spend more than a cap (DESIGN §3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any, Literal

import redis

from service import rkeys

Outcome = Literal["reserved", "replay", "idempotent", "idem_mismatch", "exhausted", "retired"]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _script(name: str) -> str:
    return resources.files("service").joinpath(f"lua/{name}.lua").read_text()


@dataclass(frozen=True)
class ReserveResult:
    """What ``reserve`` decided; ``release_id`` is the new or the earlier release."""

    outcome: Outcome
    release_id: str = ""
    measure: str = ""
    requested: int = 0
    remaining: int = 0


class Ledger:
    """Budget accounting for every dataset, backed by one Redis server."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._reserve = client.register_script(_script("reserve"))
        self._settle = client.register_script(_script("settle"))
        self._start = client.register_script(_script("start"))

    def open(
        self,
        dataset_id: str,
        caps: dict[str, int],
        actor: str,
        pipe: redis.client.Pipeline | None = None,
    ) -> None:
        """Set a new dataset's caps and record them in its audit stream."""
        p = pipe if pipe is not None else self.r.pipeline(transaction=True)
        mapping: dict[str | bytes, Any] = {f"cap:{m}": str(u) for m, u in caps.items()}
        p.hset(rkeys.ledger(dataset_id), mapping=mapping)
        event: dict[str | bytes, Any] = {"kind": "cap", "release_id": "", "actor": actor,
                                         "at": now_iso()}
        event.update({f"m:{m}": str(u) for m, u in caps.items()})
        p.xadd(rkeys.events(dataset_id), event)
        if pipe is None:
            p.execute()

    def reserve(
        self,
        dataset_id: str,
        release_id: str,
        cost: dict[str, int],
        *,
        actor: str,
        fingerprint: str,
        request_json: str,
        replay: bool = True,
        idempotency_key: str | None = None,
        idempotency_ttl: int = 86400,
        at: str | None = None,
    ) -> ReserveResult:
        """Hold ``cost`` for a new release unless it is a retry, a replay or over a cap."""
        argv: list[Any] = [
            release_id, fingerprint, actor, at or now_iso(), f"{time.time():.3f}", request_json,
            idempotency_ttl, int(idempotency_key is not None), int(replay), len(cost),
        ]
        for measure, units in sorted(cost.items()):
            argv += [measure, str(int(units))]
        reply = self._reserve(
            keys=[
                rkeys.ledger(dataset_id), rkeys.events(dataset_id), rkeys.release(release_id),
                rkeys.reservation(release_id), rkeys.replay(fingerprint),
                idempotency_key or f"{rkeys.P}idem:none", rkeys.PENDING, rkeys.RELEASES,
            ],
            args=argv,
        )
        outcome = reply[0]
        if outcome == "exhausted":
            return ReserveResult("exhausted", "", reply[1], int(reply[2]), int(reply[3]))
        return ReserveResult(outcome, reply[1])

    def mark_running(self, release_id: str, worker: str) -> bool:
        """Queued -> running; False if the release already ran (a redelivery)."""
        return bool(self._start(keys=[rkeys.release(release_id)], args=[now_iso(), worker]))

    def commit(self, dataset_id: str, release_id: str, output_json: str, actor: str) -> bool:
        """Store the output and charge the reservation, once; False if already ended."""
        return self._end(dataset_id, release_id, "commit", output_json, actor)

    def abort(self, dataset_id: str, release_id: str, error_json: str, actor: str) -> bool:
        """Refund the reservation and mark the release failed; False if already ended."""
        return self._end(dataset_id, release_id, "abort", error_json, actor)

    def _end(self, dataset_id: str, release_id: str, action: str, payload: str,
             actor: str) -> bool:
        replay_key = self.r.hget(rkeys.release(release_id), "replay_key")
        return bool(
            self._settle(
                keys=[
                    rkeys.ledger(dataset_id), rkeys.events(dataset_id), rkeys.release(release_id),
                    rkeys.reservation(release_id), rkeys.PENDING,
                    replay_key if replay_key else f"{rkeys.P}replay:none",
                ],
                args=[release_id, action, payload, actor, now_iso()],
            )
        )

    def balance(self, dataset_id: str) -> dict[str, dict[str, int]]:
        """Per measure: cap, committed, reserved and remaining, in units."""
        raw = {k: int(v) for k, v in self.r.hgetall(rkeys.ledger(dataset_id)).items()
               if k.split(":", 1)[0] in {"cap", "committed", "reserved"}}
        out: dict[str, dict[str, int]] = {}
        for name, value in raw.items():
            kind, measure = name.split(":", 1)
            out.setdefault(measure, {"cap": 0, "committed": 0, "reserved": 0})[kind] = value
        for row in out.values():
            row["remaining"] = row["cap"] - row["committed"] - row["reserved"]
        return out

    def events(self, dataset_id: str) -> list[dict[str, Any]]:
        """The dataset's audit stream, oldest first."""
        out = []
        for event_id, fields in self.r.xrange(rkeys.events(dataset_id)):
            doc: dict[str, Any] = {"id": event_id}
            amounts: dict[str, int] = {}
            for k, v in fields.items():
                key, val = k, v
                if key.startswith("m:"):
                    amounts[key[2:]] = int(val)
                else:
                    doc[key] = val
            doc["amounts"] = amounts
            out.append(doc)
        return out
