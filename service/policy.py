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

Only a deployment of the old Valkey store can hold such datasets: on PostgreSQL every
dataset is registered with its policy written down, and ``privrelease migrate-from-valkey``
(and ``privrelease standalone``'s move at start) runs ``migrate`` on the datasets it moved
(``service.storage.valkey_migration``). It is
idempotent (a document that has ``record_level`` was registered or migrated already; a
dataset's interval recharge is marked once done) and each dataset is one
compare-and-set step. Until it has run, a document without the fields is read as the
legacy policy it records (``budget.LEGACY_POLICY``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from service import budget
from service.storage.release_documents import DocumentMissing
from service.storage.store import ReleaseView, Store

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


def migrate(ledger: Store, dataset_ids: Iterable[str], actor: str = ACTOR) -> Migrated:
    """Record the implicit policy of each legacy dataset of ``dataset_ids`` (module
    docstring), then raise its interval charges (``recharge``); returns what."""
    done = Migrated()
    ids = list(dataset_ids)
    for dataset_id in ids:
        while True:
            raw = ledger.dataset_document(dataset_id)
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
    recharge(ledger, ids, done, actor)
    return done


#: releases read per page by ``shortfall``
PAGE = 500


def shortfall(ledger: Store, dataset_id: str) -> dict[str, int]:
    """Per interval measure, what the dataset's releases charged an exact increment (before
    issue #27) paid below their standalone bound: ceil(cost) units minus the units held.
    A failed release counts when it was charged; a pending one counts too (its commit
    will charge its increment), so a later refund of it leaves the ledger over, never
    under. The request documents hold both figures: ``cost`` (the mechanism's, standalone)
    and ``cost_units`` (what the ledger held)."""
    out: dict[str, int] = {}
    view = ReleaseView("datasets", frozenset({dataset_id}))
    ids, cursor = ledger.release_page(view, PAGE)
    while ids:
        for _, h in ledger.releases(ids):
            status, raw = h.get("status"), h.get("request")
            if status not in HOLDING or (status == "failed" and h.get("charged") != "1"):
                continue
            req = json.loads(raw) if raw else None
            if not isinstance(req, dict) or not req.get("cost"):
                continue
            for measure, held in req.get("cost_units", {}).items():
                if budget.base_measure(measure) != "interval_leakage":
                    continue
                standalone = budget.cost_units(measure, Fraction(req["cost"][measure]))
                if standalone > int(held):
                    out[measure] = out.get(measure, 0) + standalone - int(held)
        if cursor is None:
            break
        ids, cursor = ledger.release_page(view, PAGE, cursor)
    return out


def recharge(ledger: Store, dataset_ids: Iterable[str], done: Migrated,
             actor: str = ACTOR) -> None:
    """Charge each dataset's interval columns what their exact-increment releases paid
    below the additive rule (``shortfall``), once per dataset (``Store.recharge_interval``
    marks it; a dataset opened after the additive rule is marked already): the additive
    rule is the one that holds against adaptive designs, so a column's committed total
    must be at least the sum of its releases' standalone bounds. A column may end above
    its cap; it then refuses further interval releases, as it should."""
    for dataset_id in dataset_ids:
        try:
            units = shortfall(ledger, dataset_id)
        except DocumentMissing:  # the output store is not mounted here: a later run does it
            log.warning("interval recharge of dataset %s postponed: a release document is"
                        " missing from the output store", dataset_id)
            continue
        if ledger.recharge_interval(dataset_id, units, actor) == "recharged":
            done.recharged[dataset_id] = units
