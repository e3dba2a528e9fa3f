"""Ledger steps that a failover can neither apply twice nor lose unnoticed.

Every ledger step is one Lua script, and each is idempotent per release id: a
re-sent step (redis-py re-sends a command after a lost reply; a worker re-sends a
settle after a failover) finds what the first one did and changes nothing more.
``reserve`` answers a release that exists with itself, ``start``/``lease``/``refuse``
check the release's status and the run's token, and ``settle`` remembers the id of
the call that settled it (the last ARGV, which :class:`Step` adds once per call
and re-sends unchanged), so a re-sent settle answers "settled" again rather than
"ended" (which would make the worker discard the output it had just committed).

Replication is asynchronous: a primary that dies may take its last writes with it.
With ``PRIVRELEASE_LEDGER_REPLICAS`` > 0 every step is followed, on the same
connection, by ``WAIT <replicas> <LEDGER_WAIT_MS>``; fewer acknowledgements raise
:class:`NotReplicated`, a ConnectionError, which the API answers with 503. What a
step that was not acknowledged means after a failover (replicas apply the
primary's writes in order, so whatever survives is a prefix of them):

* a reserve lost: nothing was held and the release does not exist, so no task can
  run it (``start`` finds no release; its message, published later, is lost with
  it or finds nothing). The client got 503, "may or may not have happened", and
  retries with its Idempotency-Key. A reserve that survived is in the outbox and
  runs (the sweeper sends it), which its 503 allowed for.
* a settle (commit, fail, abort) lost: the release is back to ``running`` under
  the same run's lease. The worker re-sends the settle (:attr:`Step.retry_seconds`)
  until a primary acknowledges it; a re-send of one that survived answers
  "settled". If the worker dies instead, the lease lapses and the sweeper charges
  the run (it had read the data): the spend always counts, never twice.
* a cap change lost: the admin got 503 and repeats it (caps are set, not added).

So no acknowledgement is ever given for a spend that a failover can undo, and an
unacknowledged one errs on the side of counting.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from service.config import Config


class NotReplicated(redis.exceptions.ConnectionError):
    """Fewer replicas than required acknowledged a ledger step in time.

    The step happened on the primary but may not survive its failover. A
    ConnectionError, so the API answers 503 (``problems.UNAVAILABLE``), as for
    any step whose outcome it cannot vouch for.
    """


@dataclass(frozen=True)
class Replication:
    """How many replicas must acknowledge a ledger step, and how long to wait."""

    replicas: int = 0
    wait_ms: int = 1000

    @classmethod
    def from_config(cls, config: Config) -> Replication:
        """PRIVRELEASE_LEDGER_REPLICAS and PRIVRELEASE_LEDGER_WAIT_MS."""
        return cls(config.ledger_replicas, config.ledger_wait_ms)


#: pause between re-sends of a settle while the primary fails over
RETRY_PAUSE = 0.25
#: times a step loads its script again after NOSCRIPT (a failover can race one load)
MAX_RELOADS = 3


class Step:
    """One ledger script: run, then (if configured) WAIT for replicas on its connection.

    ``nonce``: append a fresh id as the last ARGV, once per call and the same on
    every re-send (settle.lua records it). ``retry_seconds``: keep re-sending after a
    ConnectionError or TimeoutError (a failover, a NotReplicated) for that long.
    Only for scripts idempotent under re-sending, which all of ours are.
    """

    def __init__(self, client: redis.Redis, source: str, replication: Replication,
                 *, nonce: bool = False, retry_seconds: float = 0.0) -> None:
        self.client = client
        self.script: Script = client.register_script(source)
        self.replication = replication
        self.nonce = nonce
        self.retry_seconds = retry_seconds

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        argv = [*args, secrets.token_hex(12)] if self.nonce else list(args)
        deadline = time.monotonic() + self.retry_seconds
        reloads = 0
        while True:
            try:
                return self._once(keys, argv)
            except redis.exceptions.NoScriptError:
                # a promoted replica (a restarted node) has no script cache: the script did
                # not run; load it and send it again (a pipeline does not reload by itself
                # when it loaded the script through another connection, to the old primary)
                if reloads >= MAX_RELOADS:
                    raise
                reloads += 1
                self.client.script_load(self.script.script)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                if time.monotonic() + RETRY_PAUSE > deadline:
                    raise
                time.sleep(RETRY_PAUSE)

    def _once(self, keys: list[str], argv: list[Any]) -> Any:
        want = self.replication.replicas
        if want <= 0:
            return self.script(keys=keys, args=argv)
        # WAIT counts the replicas that acknowledged this connection's writes: it must
        # follow the script on the same connection, hence one (non-transactional) pipeline
        pipe = self.client.pipeline(transaction=False)
        self.script(keys=keys, args=argv, client=pipe)
        pipe.wait(want, self.replication.wait_ms)
        try:
            reply, acked = pipe.execute()
        except redis.exceptions.ResponseError as err:
            if "replica" not in str(err):
                raise
            # a node demoted in a failover (or one a lagging sentinel still names): the
            # script wrote nothing there (a write is READONLY on a replica); connect anew
            self.client.connection_pool.disconnect()
            raise NotReplicated("the connection reached a replica, not the primary") from err
        if int(acked) < want:
            raise NotReplicated(f"{acked} of {want} replicas acknowledged a ledger step"
                                f" within {self.replication.wait_ms} ms")
        return reply
