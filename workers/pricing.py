"""Pricing jobs: the cold heavy precomputation of a cost, done by a worker, never an API thread.

A release whose cost needs a heavy precomputation (interval calibration, an ICLP
eigen-system) missing from the shared store is created ``pricing`` by the API after
every cheap check. Its job prepares the request again, computing what was missing into
the store, and reserves the cost through the ledger's one reserve script (mode
``priced``), which reserves a release at most once: a redelivered or doubled job finds
it no longer pricing and changes nothing. Then the release continues as any queued one
(the outbox, the run task, lease, settle). A refusal (budget, allocation, retired
dataset, an identical earlier release, a request the mechanism refuses) ends it
``refused`` with the problem the synchronous POST would have answered; nothing was held,
so nothing is charged or refunded.

Only public inputs are involved (the request, the dataset's metadata, the ledger), so
what the caller learns does not depend on the data.
"""

from __future__ import annotations

import json
import logging

import redis
from celery.exceptions import SoftTimeLimitExceeded

from service import precompute, releases, rkeys
from service.config import Config
from service.ledger import Ledger, ReserveResult
from service.problems import APIError

log = logging.getLogger("privrelease.pricing")

#: the actor the audit stream names for a refusal by a pricing job
ACTOR = "pricing"


def price(config: Config, client: redis.Redis, ledger: Ledger, release_id: str,
          send: releases.Sender) -> str:
    """Price, reserve and enqueue a ``pricing`` release, or refuse it.

    Returns 'priced' (reserved and its run sent), 'refused', 'skipped' (it had left
    ``pricing``: reserved by an earlier run of this job, or cancelled) or 'missing'.
    A Valkey or broker error propagates: the release stays where it was (pricing, or
    reserved in the outbox) for the sweeper to send again.
    """
    status, raw, actor = client.hmget(rkeys.release(release_id), "status", "request", "actor")
    if status is None:
        return "missing"
    if status != "pricing":
        if status == "queued" and ledger.unsent(release_id, 0.0):
            # an earlier run reserved it and died before sending its run: send it now
            releases.enqueue(send, ledger, release_id)
        return "skipped"
    req = json.loads(raw)
    dataset_id = req["dataset_id"]
    res: ReserveResult | None = None
    problem: APIError | None
    try:
        with precompute.worker_scope(config):
            prepared = releases.prepare(
                client, ledger, req["body"], allow_seeds=config.allow_seeds,
                max_work=config.max_release_work)
        res = ledger.reserve(
            dataset_id, release_id, prepared.cost_units, actor=actor or "",
            fingerprint=prepared.request_fingerprint,
            replay_fingerprint=prepared.fingerprint,
            request_json=prepared.request_json(), mode="priced",
            notion_lock=prepared.notion_lock)
        assert res is not None
        problem = releases.refusal(res)
        if res.outcome == "replay":  # the synchronous POST answers with that release
            problem = APIError(409, "an identical request was released before (release_id);"
                               " nothing was spent", code="replayed",
                               release_id=res.release_id)
    except APIError as err:  # refused as the POST would have been
        problem = err
    except redis.RedisError:
        raise
    except SoftTimeLimitExceeded:
        problem = APIError(503, "computing the cost took longer than this server's time"
                           " limit", code="time_limit")
    except Exception as err:  # a bug: public inputs only, so its type may be told
        log.error("pricing failed", extra={"release_id": release_id,
                                           "error_type": type(err).__name__})
        problem = APIError(500, f"computing the cost failed ({type(err).__name__})",
                           code="pricing_failed")
    if problem is not None:
        if not ledger.refuse(dataset_id, release_id, json.dumps(releases.error_doc(problem)),
                             problem.code, ACTOR):
            return "skipped"  # cancelled meanwhile
        log.info("priced release refused", extra={"release_id": release_id,
                                                  "code": problem.code})
        return "refused"
    assert res is not None
    if res.outcome != "reserved":  # 'ended': cancelled, or reserved by another run
        return "skipped"
    releases.enqueue(send, ledger, release_id)  # an error leaves it in the outbox
    return "priced"


def precompute_estimate(config: Config, client: redis.Redis, ledger: Ledger, body_json: str,
                        marker: str) -> str:
    """Compute a cold estimate's heavy precomputation into the shared store, so the
    caller's retry is warm; then drop the job's marker (``rkeys.pricing_job``).

    A refusal is not reported here: the retry prepares the request again and answers it
    (interval calibrations store their refusals too)."""
    try:
        with precompute.worker_scope(config):
            releases.prepare(client, ledger, json.loads(body_json),
                             allow_seeds=config.allow_seeds, max_work=config.max_release_work)
        return "computed"
    except APIError:
        return "refused"
    finally:
        client.delete(marker)
