"""The sweeper's read of the broker: every held message read once, ids matched exactly.

Catches the pass that joined every queued message into one string and searched it once
per pending release (1.6 s of CPU per pass at 2,690 queued: quadratic in the backlog),
and a substring match that took ``rel_ab`` for a message of ``rel_abc``, in the unacked
set (``_broker``, every pass; test_sweeper_backlog.py shows a pass reads no queue list).
"""

from __future__ import annotations

import json
import time

from service.releases import sweeper
from service.storage import rkeys
from service.storage.store import PRICING, RUN


def _message(task_id: str, release_id: str) -> str:
    """A message as kombu's Redis transport keeps it (the body base64, so no id in it)."""
    return json.dumps({"body": "W1sicmVsXzEyMyJdLCB7fV0=", "content-encoding": "utf-8",
                       "headers": {"id": task_id, "task": "privrelease.run_release",
                                   "argsrepr": f"['{release_id}']"},
                       "properties": {"body_encoding": "base64"}})


#: a database no worker serves: the session's workers would take these messages
DB = 11
QUEUES = (sweeper.RELEASES_QUEUE, sweeper.PRICING_QUEUE)


def test_ids_are_read_once_per_message_and_matched_exactly(redis_url: str) -> None:
    r = rkeys.connect(redis_url.rsplit("/", 1)[0] + f"/{DB}")
    r.delete(*QUEUES, sweeper.UNACKED, sweeper.UNACKED_INDEX)
    try:
        queued = [f"rel_{i:024x}" for i in range(3000)]
        r.rpush(sweeper.RELEASES_QUEUE, *[_message(rid, rid) for rid in queued])
        r.rpush(sweeper.PRICING_QUEUE, _message("rel_abc.pricing", "rel_abc"))
        now = time.time()
        held = {f"t{i}": json.dumps([json.loads(_message(rid, rid)), "", "releases"])
                for i, rid in enumerate(queued)}
        r.hset(sweeper.UNACKED, mapping={
            **held,
            "tag1": json.dumps([json.loads(_message("rel_held", "rel_held")), "", "releases"]),
            "tag2": json.dumps([json.loads(_message("rel_held", "rel_held")), "", "releases"]),
            "tag_abc": json.dumps([json.loads(_message("rel_abc.pricing", "rel_abc")), "",
                                   "pricing"])})
        r.zadd(sweeper.UNACKED_INDEX, {"tag1": now - 100})
        started = time.process_time()
        broker = sweeper._broker(r)
        scanned = time.process_time() - started
        assert set(broker.held) == set(queued) | {"rel_held", "rel_abc"}
        assert "rel_ab" not in broker.held  # exact ids, not substrings
        assert sorted(map(repr, broker.held["rel_held"])) == sorted([repr(now - 100), "None"])
        assert broker.empty == frozenset()  # both queues hold messages
        # kombu's index lacks tag2's time: never stranded while one delivery is unknown
        assert not sweeper._stranded("rel_held", broker.held, now)
        assert scanned < 1.0  # one pass over 3,000 messages (was seconds, quadratic)
        r.delete(*QUEUES)
        assert sweeper._broker(r).empty == {RUN, PRICING}
    finally:
        r.delete(*QUEUES, sweeper.UNACKED, sweeper.UNACKED_INDEX)
