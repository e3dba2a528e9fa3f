"""The policy migration: datasets registered before notions and record-level releases were
the operator's explicit opt-in keep what they admitted, written down.

Before it, a dataset admitted all four notions unless its metadata named some, allowed
record-level releases (subset, interval, noiseless.local, DIP, ...), got a ``subset_draws``
cap of 1 per categorical column, and an analyst's allocation limited only the measures it
listed. Now a dataset admits only what its metadata and budgets name, and an allocation
allows none of the measures it does not list. So that a deployment's existing datasets
keep working as their operators set them up, ``migrate`` records their implicit policy as
explicit fields: ``notions`` (all four unless named), ``record_level: true``, the
``subset_draws`` caps already in their ledger kept, and their allocations marked
``legacy`` (unlisted measures unlimited; an allocation written later is ``listed``), with
one ``policy`` audit event per dataset.

It is idempotent (a document that has ``record_level`` was registered or migrated
already) and safe to run from any number of processes at once (each dataset is one
compare-and-set script), so the API and workers run it at start-up and
``privrelease migrate-policy`` runs it by hand. Until it has run, a document without the
fields is read as the legacy policy it records (``budget.LEGACY_POLICY``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from fractions import Fraction

import redis

from service import budget
from service.storage import rkeys
from service.storage.ledger import Ledger
from service.storage.release_documents import DocumentMissing, DocumentStore, request_of
from service.storage.store import Store

log = logging.getLogger("privrelease.policy")

#: the actor of the migration's audit events
ACTOR = "system:policy-migration"


@dataclass
class Migrated:
    """What ``migrate`` did: datasets migrated, the keys whose allocations it marked
    legacy, by dataset, and the interval units it added to committed totals (``recharge``),
    by dataset and measure."""

    datasets: list[str] = field(default_factory=list)
    legacy_allocations: dict[str, list[str]] = field(default_factory=dict)
    recharged: dict[str, dict[str, int]] = field(default_factory=dict)

#: statuses whose reservation holds or has spent its units (a refunded, refused or
#: cancelled release spent nothing; a pricing one holds nothing yet)
HOLDING = frozenset({"queued", "running", "succeeded", "failed"})


def needs_migration(doc: dict[str, object]) -> bool:
    """A document written before the policy fields (registration now always stores them)."""
    return "record_level" not in doc


def migrate(client: redis.Redis, ledger: Ledger, actor: str = ACTOR) -> Migrated:
    """Record every legacy dataset's implicit policy (module docstring); returns what."""
    done = Migrated()
    for dataset_id in client.zrange(rkeys.DATASETS, 0, -1):
        while True:
            raw = client.get(rkeys.dataset(dataset_id))
            if raw is None:
                break
            doc = json.loads(raw)
            if not needs_migration(doc):
                break
            notions = budget.admitted_notions(doc)
            new = {**doc, "notions": notions,
                   "record_level": bool(budget.LEGACY_POLICY["record_level"])}
            outcome, keys = ledger.migrate_policy(dataset_id, raw, json.dumps(new), actor,
                                                  notions, new["record_level"])
            if outcome == "conflict":
                continue  # changed since read (a version, a retirement): read it again
            if outcome == "migrated":
                done.datasets.append(dataset_id)
                if keys:
                    done.legacy_allocations[dataset_id] = keys
            break
    recharge(client, ledger, done, actor)
    return done


def shortfall(client: redis.Redis, docs: DocumentStore | None,
              dataset_id: str) -> dict[str, int]:
    """Per interval measure, what the dataset's releases charged an exact increment (before
    issue #27) paid below their standalone bound: ceil(cost) units minus the units held.
    A failed release counts when it was charged; a pending one counts too (its commit
    will charge its increment), so a later refund of it leaves the ledger over, never
    under. The request documents hold both figures: ``cost`` (the mechanism's, standalone)
    and ``cost_units`` (what the ledger held)."""
    key = rkeys.dataset_releases(dataset_id)
    out: dict[str, int] = {}
    for start in range(0, client.zcard(key), 500):
        ids = client.zrange(key, start, start + 499)
        pipe = client.pipeline(transaction=False)
        for release_id in ids:
            pipe.hmget(rkeys.release(release_id), "request", "status", "charged", "doc")
        for release_id, (raw, status, charged, sha) in zip(ids, pipe.execute(), strict=True):
            if status not in HOLDING or (status == "failed" and charged != "1"):
                continue
            h = {k: v for k, v in (("request", raw), ("doc", sha)) if v is not None}
            req = request_of(docs, release_id, h)
            if req is None or not req.get("cost"):
                continue
            for measure, held in req.get("cost_units", {}).items():
                if budget.base_measure(measure) != "interval_leakage":
                    continue
                standalone = budget.cost_units(measure, Fraction(req["cost"][measure]))
                if standalone > int(held):
                    out[measure] = out.get(measure, 0) + standalone - int(held)
    return out


def recharge(client: redis.Redis, ledger: Ledger, done: Migrated,
             actor: str = ACTOR) -> None:
    """Charge every dataset's interval columns what their exact-increment releases paid
    below the additive rule (``shortfall``), once per dataset (recharge.lua's marker): the
    additive rule is the one that holds against adaptive designs, so a column's committed
    total must be at least the sum of its releases' standalone bounds. A column may end
    above its cap; it then refuses further interval releases, as it should."""
    ids = client.zrange(rkeys.DATASETS, 0, -1)
    pipe = client.pipeline(transaction=False)
    for dataset_id in ids:
        pipe.hexists(rkeys.ledger(dataset_id), "recharged:interval")
    for dataset_id, marked in zip(ids, pipe.execute(), strict=True):
        if marked:
            continue  # done, or opened after the additive rule (open.lua marks it)
        try:
            units = shortfall(client, ledger.documents, dataset_id)
        except DocumentMissing:  # the output store is not mounted here: a later run does it
            log.warning("interval recharge of dataset %s postponed: a release document is"
                        " missing from the output store", dataset_id)
            continue
        if ledger.recharge_interval(dataset_id, units, actor) == "recharged":
            done.recharged[dataset_id] = units


def migrate_at_startup(client: redis.Redis, ledger: Store, who: str) -> None:
    """``migrate`` as a process starts; Valkey unreachable leaves it to a later start (or
    the CLI): a legacy document is read as its legacy policy meanwhile. Only the Valkey
    store can hold legacy datasets: on PostgreSQL every dataset was registered with its
    policy written down (``privrelease migrate-from-valkey`` migrates before it moves)."""
    if not isinstance(ledger, Ledger):
        return
    try:
        done = migrate(client, ledger)
    except redis.RedisError as err:
        log.warning("policy migration skipped at %s start-up (%s); it runs at the next"
                    " start or with privrelease migrate-policy", who, type(err).__name__)
        return
    if done.datasets:
        log.info("policy migration at %s start-up: %d dataset(s) recorded with their legacy"
                 " policy", who, len(done.datasets))
    if done.recharged:
        log.info("policy migration at %s start-up: interval columns of %d dataset(s) charged"
                 " up to the additive rule", who, len(done.recharged))
