"""Pricing a release request: every check, the cost and the accuracy statement.

Everything here runs before the data is touched: the mechanism's schema and
the dataset's public metadata decide the cost, which the ledger then holds.
When the cost needs a heavy precomputation that is not stored yet, ``prepare``
raises ``Unpriced`` after every cheap check: the release is created ``pricing``
and a worker prepares it again (computing), reserves and enqueues it.

Heavy parts of a cost (interval calibration, ICLP eigen-systems) depend only on public
inputs, so:

* a request whose estimated work exceeds ``PRIVRELEASE_MAX_PRECOMPUTE_WORK`` is refused
  with 422 naming the parameter that drives it, before anything is computed;
* results are stored under ``<data dir>/precompute`` (one file per input digest, at most
  ``PRIVRELEASE_PRECOMPUTE_MAX_BYTES``), shared by every API process and worker on the
  host, so each is computed once per input;
* in an API request (``api_scope``) a result that is not in the store is never
  computed: the gate raises ``mechanisms.precompute.Busy`` carrying the store key that
  missed, and the release or estimate is handed to a worker (``Unpriced``, answered 202
  ``pricing``). A worker (``worker_scope``) computes it into the store, so the retry, or
  the rest of the pricing job, is warm. The API's threads only ever read files, so
  health checks and reads keep answering whatever the load of cold requests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from types import TracebackType
from typing import Any

import marshmallow

import mechanisms
from mechanisms import memory, precompute, target, zcdp
from mechanisms.suggest import did_you_mean
from service import budget, datasets
from service.config import Config
from service.errors import Failed, Invalid, NotFound, Retired, ServiceError, by_status
from service.releases.request import JobRequest, request_fingerprint
from service.storage.objects import ObjectStore
from service.storage.precompute_objects import ObjectCache
from service.storage.release_tables import INLINE_ROWS
from service.storage.store import Store

# ------------------------------------------------ heavy parts: never cold in the API


def precomputed(config: Config, objects: ObjectStore) -> ObjectCache:
    """The shared store of precomputations: in the service's object store, which every
    API and worker host reaches (``PRIVRELEASE_STORAGE_URL``)."""
    return ObjectCache(objects, max_bytes=config.precompute_max_bytes)


class _Recording:
    """The shared store, remembering the first key this request missed (the job's key)."""

    def __init__(self, inner: precompute.Store) -> None:
        self.inner = inner
        self.missed: str | None = None

    def get(self, key: str) -> bytes | None:
        value = self.inner.get(key)
        if value is None and self.missed is None:
            self.missed = key
        return value

    def put(self, key: str, value: bytes) -> None:
        self.inner.put(key, value)


class _RefuseCold(contextlib.AbstractContextManager[None]):
    """The API's gate: a cold computation never starts in a request thread."""

    def __init__(self, seen: _Recording) -> None:
        self.seen = seen

    def __enter__(self) -> None:
        raise precompute.Busy(self.seen.missed)

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


def cold_key(err: precompute.Busy) -> str | None:
    """The store key whose miss refused the computation (None if unknown)."""
    return str(err.args[0]) if err.args and err.args[0] else None


@contextlib.contextmanager
def api_scope(config: Config, shared: precompute.Store) -> Iterator[None]:
    """Within the block, heavy results are read from the shared store, bounded by the work
    limit, and a missing one raises ``mechanisms.precompute.Busy`` instead of computing."""
    seen = _Recording(shared)
    with precompute.use(seen, lambda: _RefuseCold(seen), config.max_precompute_work):
        yield


@contextlib.contextmanager
def worker_scope(config: Config, shared: precompute.Store) -> Iterator[None]:
    """Within the block (a worker's job), cold results are computed and stored."""
    with precompute.use(shared, None, config.max_precompute_work):
        yield


# ------------------------------------------------------------------- the request


@dataclass(frozen=True)
class Prepared:
    """A validated release request, ready to be reserved and enqueued."""

    dataset: dict[str, Any]
    mechanism: mechanisms.Mechanism
    params: dict[str, Any]
    #: the mechanism's own cost, what its run calibrates to (ε for laplace on any dataset)
    cost: dict[str, Fraction]
    #: what the ledger holds, in units: the cost, or on a zcdp dataset its ρ (ε²/2 for ε)
    cost_units: dict[str, int]
    accuracy: dict[str, Any]
    seed: int | None
    callback_url: str | None = None
    #: params as the client wrote them (validated), before the mechanism completed them
    #: from the ledger's history; None when it completed nothing
    requested_params: dict[str, Any] | None = None
    #: the budget the request agreed to (the cost is at most this, per measure)
    requested_budget: dict[str, Fraction] = field(default_factory=dict)
    #: the exclusive notion this release locks its dataset to ('' for none; budget.notion_lock)
    notion_lock: str = ""
    #: the release document's ``privacy`` block (``privacy_block``)
    privacy: dict[str, Any] | None = None
    #: an estimate for a target accuracy: the target and what the search found
    #: (``target_block``); None for a request with a budget
    target: dict[str, Any] | None = None

    @property
    def request_fingerprint(self) -> str:
        """What an Idempotency-Key must match (``request_fingerprint``)."""
        return request_fingerprint(
            self.dataset, self.mechanism.name,
            self.params if self.requested_params is None else self.requested_params,
            self.requested_budget, self.seed)

    @property
    def fingerprint(self) -> str:
        """Same dataset version, mechanism, params, cost (and seed) -> same release.

        The params are the client's: a retry or an identical request after the first one
        committed must find it, though the history (e.g. subset prior_draws) has moved on.
        """
        body = {
            "dataset_id": self.dataset["id"],
            "version": self.dataset["version"],
            "mechanism": self.mechanism.name,
            "params": self.params if self.requested_params is None else self.requested_params,
            "cost": self.cost_units,
            "seed": self.seed,
        }
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def job(self) -> JobRequest:
        """What the worker needs, and provenance for the document."""
        return JobRequest(self.dataset["id"], self.dataset["version"], self.mechanism.name,
                          self.params, dict(self.cost), dict(self.cost_units), self.accuracy,
                          self.seed, self.callback_url, self.privacy)


@dataclass(frozen=True)
class PricingRequest:
    """A request that passed every cheap check (grant, dataset, params, work limit) but
    whose cost needs a heavy precomputation missing from the shared store."""

    dataset: dict[str, Any]
    mechanism: str
    params: dict[str, Any]
    requested_budget: dict[str, Fraction]
    seed: int | None
    callback_url: str | None
    #: the validated request body, which the pricing job prepares again in a worker
    body: dict[str, Any]

    @property
    def fingerprint(self) -> str:
        return request_fingerprint(self.dataset, self.mechanism, self.params,
                                   self.requested_budget, self.seed)

    def job(self) -> JobRequest:
        """The release's request while it is priced: no cost or accuracy yet."""
        return JobRequest(self.dataset["id"], self.dataset["version"], self.mechanism,
                          self.params, seed=self.seed, callback_url=self.callback_url,
                          body=self.body)


class Unpriced(Exception):
    """The cost needs a cold heavy precomputation, which no API thread runs: the request
    becomes a job (``key``: the store key that missed, for deduplicating jobs)."""

    def __init__(self, request: PricingRequest, key: str | None) -> None:
        super().__init__("cost not yet computed")
        self.request = request
        self.key = key


def no_such_dataset() -> ServiceError:
    """The answer for a request naming a dataset that does not exist, or that the key may
    not use (the two must be indistinguishable)."""
    return NotFound("no such dataset", code="not_found", field="dataset_id")


def check_work(work: mechanisms.Work, limit: float, what: str) -> None:
    """Refuse a task whose work estimate (public inputs only) exceeds the ceiling: 422
    ``work_limit`` naming the input that drives it and the limit."""
    if work.units > limit:
        hint = f"; {work.hint}" if work.hint else ""
        raise Invalid(f"{what} would need about {work.units:.3g} work units, above this"
                       f" server's limit of {limit:.3g}{hint}", code="work_limit",
                       field=work.field, work=work.units, limit=limit)


def prepare(ledger: Store, body: dict[str, Any], *, allow_seeds: bool,
            max_work: float | None = None, max_memory: float | None = None,
            distributed: bool = False,
            found: tuple[str, set[str], str] | None = None) -> Prepared:
    """Validate a release request against its mechanism and dataset; compute the cost.
    ``max_work`` and ``max_memory`` (bytes): the server's ceilings on the release's work and
    its worker's memory (``memory_limit``; the worker checks that again before reading,
    knowing the engine). ``distributed``: a Spark engine is configured, so a record-level
    row map keeps its table there (``memory.held``).
    ``found``: the dataset's pricing read, when the caller has one (``dataset_cache``)."""
    # the document and the measures its caps name, in one read
    if found is None:
        found = ledger.dataset_for_pricing(body["dataset_id"])
    if found is None:
        raise no_such_dataset()
    doc, named = json.loads(found[0]), found[1]
    if doc.get("status") != "active":
        raise Retired("dataset is retired", field="dataset_id")
    try:  # the asked version (default: the current one), as a release on it sees it
        doc = datasets.at_version(doc, body.get("version"))
    except datasets.VersionError as err:
        raise by_status(err.status, err.message, code=err.code, field=err.field) from None
    try:
        mech = mechanisms.get(body["mechanism"])
    except KeyError:
        raise Invalid(f"unknown mechanism{did_you_mean(body['mechanism'], mechanisms.names())};"
                      " GET /v1/mechanisms lists them", code="validation_error",
                      field="mechanism") from None
    if (doc.get("gaussian_accounting") == "zcdp" and "delta" in mech.measures
            and not mech.zcdp_native):
        raise Invalid(f"{mech.name} is accounted in (epsilon, delta); this dataset"
                       " accounts Gaussian noise in zCDP (rho)", code="validation_error",
                       field="mechanism")
    try:
        params = mech.load_params(body.get("params"))
    except marshmallow.ValidationError as err:
        errors = prefixed("params", err.messages)
        first = next(iter(errors))
        raise Invalid(f"invalid request: {first}: {errors[first]}",
                       code="validation_error", field=first, errors=errors) from None
    seed = body.get("seed")
    if seed is not None and not allow_seeds:
        raise Invalid("client-chosen seeds are refused by this server",
                       code="validation_error", field="seed")
    wanted = body.get("target")  # an estimate's target accuracy, instead of a budget
    requested = _budget(body.get("budget")) if wanted is None else {}
    target_doc: dict[str, Any] | None = None
    meta = datasets.meta(doc)
    # the operator's policy, before anything is priced or reserved: the notion, the
    # record-level opt-in, and measures the dataset's budgets name
    check_notions(doc, mech.measures)
    check_record_level(doc, mech)
    check_measures(named, ledger_measures(mech.measures, doc) | set(mech.charged_columns(params)))
    as_written = params
    # what earlier releases hold: committed, and reserved by jobs still in the queue (they
    # will run first); a refunded one only makes the reported design more cautious
    params = mech.with_history(params, lambda: {
        m: budget.from_units(m, row["committed"] + row["reserved"])
        for m, row in ledger.balance(doc["id"]).items()})
    try:
        for i, ref_id in enumerate(mech.reference_datasets(params)):
            ref = datasets.get(ledger, ref_id)
            if ref is None or not ref.get("public"):
                raise Invalid("not a registered public reference dataset",
                               code="validation_error", field=f"params.reference.{i}")
            mech.check_reference(params, meta, datasets.meta(ref))
        if max_work is not None:
            check_work(mech.work(params, meta), max_work, "this release")
        if max_memory is not None:
            memory.check(memory.held(mech, params, meta, distributed=distributed,
                                     held_rows=INLINE_ROWS), max_memory, "this release")
        if wanted is not None:  # the smallest budget meeting the target, then as asked
            found_budget = budget_for_target(ledger, doc, mech, params, meta, wanted)
            requested, target_doc = found_budget.budget, target_block(wanted, found_budget)
        cost, accuracy = mech.price(params, requested, meta)  # cost, then its accuracy
        # what the ledger holds: the cost as is, or on a zcdp dataset in ρ (pure ε as ε²/2);
        # ``cost`` stays what the mechanism calibrates to, and the worker runs it with that
        charged = zcdp.charge(cost, mech.name) if meta.gaussian_accounting == "zcdp" else cost
        history = charge_on_history(ledger, doc, mech, params, cost, meta, charged)
        report = history.report
        if report is not None:
            accuracy = {**accuracy, "composition": report}
    except mechanisms.MechanismInputError as err:
        raise Invalid(err.message, code=err.code, field=err.field, **err.extra) from None
    except precompute.Busy as cold:  # every cheap check passed: a worker prices it
        # the version chosen now: its pricing job prepares the same one whatever is current
        pricing = PricingRequest(doc, mech.name, as_written, requested, seed,
                                 body.get("callback_url"), {**body, "version": doc["version"]})
        raise Unpriced(pricing, cold_key(cold)) from None
    for measure, amount in charged.items():
        # a per-column cost (interval_leakage:age) is agreed to as interval_leakage; a pure
        # release's ρ on a zcdp dataset as its ε (ε²/2, mechanisms.zcdp)
        agreed = requested.get(measure, requested.get(budget.base_measure(measure)))
        field = f"budget.{measure if measure in requested else budget.base_measure(measure)}"
        if measure == "rho" and agreed is None and "epsilon" in requested:
            agreed, field = zcdp.pure_to_rho(requested["epsilon"]), "budget.epsilon"
        if budget.base_measure(measure) not in budget.MEASURES or agreed is None:
            raise Failed("mechanism charged a measure the request did not name")
        if amount > agreed:
            raise Failed("mechanism cost exceeds the agreed budget")
        unit = budget.from_units(measure, 1)
        if 0 < amount < unit:  # charging a whole unit would take more than agreed
            raise Invalid(f"charges {measure} {float(amount):g}, below the smallest"
                           f" amount the ledger can charge ({float(unit):g})",
                           code="validation_error", field=field)
    check_measures(named, charged)  # per column: interval_leakage:age must be named itself
    units = {m: budget.cost_units(m, a) for m, a in charged.items()}
    privacy = privacy_block(doc, units)
    if "zcdp" in privacy:
        accuracy = {**accuracy, "zcdp": privacy["zcdp"]}
    if history.privacy is not None:
        privacy["interval_composition"] = history.privacy
        privacy["charged"] = history.privacy["charged"]
    return Prepared(doc, mech, params, cost, units, accuracy, seed, body.get("callback_url"),
                    requested_params=as_written, requested_budget=requested,
                    notion_lock=budget.notion_lock(charged, doc), privacy=privacy,
                    target=target_doc)


def budget_for_target(ledger: Store, doc: dict[str, Any], mech: mechanisms.Mechanism,
                      params: dict[str, Any], meta: mechanisms.DatasetMeta,
                      wanted: dict[str, Any]) -> target.Found:
    """The smallest budget whose stated 95 % half-width meets ``wanted`` (the request's
    ``target``), searched up to the dataset's cap of the searched measure: the largest
    budget any key may ask for (a key's allocation shows as ``fits``/``shortfall``)."""
    fixed = {}
    if "delta" in wanted:  # held fixed for an (epsilon, delta) mechanism
        fixed = _budget({"delta": wanted["delta"]}, where="target")
    goal = target.Target(float(wanted["half_width"]), float(wanted.get("level", target.LEVEL)),
                         fixed)
    measure = target.searched_measure(mech, meta, goal.fixed)
    rows, _ = ledger.budget(doc["id"])
    return target.budget_for(mech, params, meta, goal, largest_amount(rows, measure, meta),
                             least_amount(measure, meta))


def least_amount(measure: str, meta: mechanisms.DatasetMeta) -> Fraction:
    """The least of ``measure`` the ledger can charge as written: one unit, or a pure ε on
    a zcdp dataset whose ρ = ε²/2 is at least one ρ unit (e² · U_ρ >= 2 · U_ε²)."""
    if meta.gaussian_accounting == "zcdp" and measure == "epsilon":
        per_eps, per_rho = budget.unit("epsilon"), budget.unit("rho")
        bound = -(-2 * per_eps**2 // per_rho)  # ceil(2 U_ε² / U_ρ)
        root = math.isqrt(bound)
        return budget.from_units("epsilon", root if root * root == bound else root + 1)
    return budget.from_units(measure, 1)


def largest_amount(rows: dict[str, dict[str, int]], measure: str,
                   meta: mechanisms.DatasetMeta) -> Fraction:
    """The most of ``measure`` a request on this dataset can ask for: its cap; a pure ε on a
    zcdp dataset is charged ρ = ε²/2 (``zcdp.charge``), so the largest whole-unit ε whose ρ,
    rounded up to units, is within the ρ cap; a per-column measure's smallest column cap."""
    if meta.gaussian_accounting == "zcdp" and measure == "epsilon":
        rho_cap = rows.get("rho", {}).get("cap", 0)
        # ceil(e²/2 · U_ρ/U_ε²) <= cap  <=>  e² · U_ρ <= 2 · cap · U_ε²
        per_eps, per_rho = budget.unit("epsilon"), budget.unit("rho")
        return budget.from_units("epsilon", math.isqrt(2 * rho_cap * per_eps**2 // per_rho))
    if measure in rows:
        return budget.from_units(measure, rows[measure]["cap"])
    columns = [row["cap"] for m, row in rows.items() if budget.base_measure(m) == measure]
    return budget.from_units(measure, min(columns, default=0))


def target_block(wanted: dict[str, Any], found: target.Found) -> dict[str, Any]:
    """The target as asked, and what meets it: the searched measure, the half-width (and
    level) stated at the budget found, how many budgets were evaluated."""
    return {**wanted, "level": wanted.get("level", target.LEVEL), "measure": found.measure,
            "stated_half_width": found.stated.half_width, "stated_level": found.stated.level,
            "evaluations": found.evaluations}


def estimate(ledger: Store, prepared: Prepared, key_id: str) -> dict[str, Any]:
    """A dry run's answer: cost, accuracy, what this key may still spend of each measure
    and whether the cost fits. What is left is the dataset's remainder, or the key's
    allocation's if smaller; a listed allocation allows none of a measure it does not
    list (``Store.reserve``)."""
    rows, allocations = ledger.budget(prepared.dataset["id"])
    mine = allocations.get(key_id, {})
    rule = ledger.allocation_scopes(prepared.dataset["id"]).get(key_id)
    unlisted = 0 if rule == "listed" else 1 << 62
    remaining = {m: min(rows.get(m, {}).get("remaining", 0),
                        mine.get(m, {}).get("remaining", unlisted))
                 for m in prepared.cost_units}
    short = {m: units - remaining[m] for m, units in prepared.cost_units.items()
             if units > remaining[m]}
    found: dict[str, Any] = {}
    if prepared.target is not None:  # what a release request sends to get this estimate
        found = {"budget": {m: budget.pasteable(a)
                            for m, a in sorted(prepared.requested_budget.items())},
                 "target": prepared.target}
    return {
        "mechanism": prepared.mechanism.name,
        "cost": cost_doc(prepared.cost_units),
        "accuracy": prepared.accuracy,
        "remaining": {m: budget.display(m, max(r, 0)) for m, r in remaining.items()},
        "fits": not short,
        "shortfall": {m: budget.display(m, u) for m, u in short.items()},
        **found,
    }


def cost_doc(units: dict[str, int]) -> dict[str, float]:
    """A cost as the documents show it: each measure's amount, from its ledger units."""
    return {m: budget.display(m, u) for m, u in sorted(units.items())}


@dataclass(frozen=True)
class HistoryCharge:
    """A release's charge given its dataset's history (``charge_on_history``)."""

    #: what the ledger holds per measure (interval releases: the standalone cost, additive)
    charged: dict[str, Fraction]
    #: ``accuracy.composition`` (None: nothing to show)
    report: dict[str, Any] | None
    #: the ``privacy`` block's ``interval_composition``: what was charged and why
    privacy: dict[str, Any] | None = None


def charge_on_history(ledger: Store, doc: dict[str, Any], mech: mechanisms.Mechanism,
                      params: dict[str, Any], cost: dict[str, Fraction],
                      meta: mechanisms.DatasetMeta,
                      charged: dict[str, Fraction]) -> HistoryCharge:
    """The charge of a release given the dataset's earlier releases (this version): the
    mechanism's ``composed`` charge on the measures it names, else ``charged``. An
    interval release pays its standalone bound (Thm 4, additive), which holds for designs
    chosen after seeing earlier outputs (``mechanisms.interval.composition.price``); the
    exact joint leakage of its column is reported, not charged."""
    def history() -> list[dict[str, Any]]:
        return earlier_releases(ledger, doc)

    composed = mech.composed(params, cost, meta, history)
    if composed is None:
        return HistoryCharge(charged, mech.composition(params, cost, meta, history))
    # interval leakage is charged as it is on any dataset (zcdp.charge)
    charged = {**charged, **{m: a for m, a in composed.charge.items() if m in charged}}
    return HistoryCharge(charged, composed.report, dict(composed.privacy))


#: what a release on a dataset that allows both noiseless and DP releases says of the pair
MIXED_STATEMENT = (
    "This dataset allows both noiseless and DP releases. A DP output and a noiseless output"
    " of the same data together have no finite guarantee in either notion (continuous-noise"
    " DP has noiseless epsilon = infinity; a deterministic quantizer is not epsilon-DP for"
    " any finite epsilon); this release's guarantee holds only together with releases of"
    " its own notion.")


def privacy_block(doc: dict[str, Any], units: dict[str, int]) -> dict[str, Any]:
    """The release's ``privacy`` block from public inputs: its notions; its ρ and (ε, δ) on
    a zcdp dataset; and, where the operator allowed noiseless and DP releases together,
    that the pair has no finite guarantee in either notion (noiseless spec §11.3)."""
    notions = budget.notions_of(units)
    out: dict[str, Any] = {"notions": sorted(notions)}
    if "rho" in units:
        out["zcdp"] = zcdp_statement(doc, budget.from_units("rho", units["rho"]))
    admitted = set(budget.admitted_notions(doc))
    if (doc.get("allow_mixed_noiseless_dp", False) and admitted >= budget.EXCLUSIVE
            and notions & budget.EXCLUSIVE):
        out["mixed_noiseless_dp"] = {"pair_guarantee": None, "statement": MIXED_STATEMENT}
    return out


def check_notions(doc: dict[str, Any], measures: Any) -> None:
    """Refuse (422 ``notion_not_admitted``) a mechanism whose privacy notion the dataset's
    metadata does not admit: public metadata and the mechanism's name decide, nothing else."""
    admitted = set(budget.admitted_notions(doc))
    refused = sorted(budget.notions_of(measures) - admitted)
    if refused:
        raise Invalid(f"this dataset does not admit {', '.join(refused)} releases;"
                       f" it admits: {', '.join(sorted(admitted)) or 'none'}",
                       code="notion_not_admitted", field="mechanism", notions=sorted(admitted))


#: the answer to a record-level mechanism on a dataset whose operator did not opt in
RECORD_LEVEL_REFUSED = (
    "{name} releases one output per record, and this dataset's metadata does not allow"
    " record-level releases (the operator opts in with record_level: true); nothing was"
    " spent")


def check_record_level(doc: dict[str, Any], mech: mechanisms.Mechanism) -> None:
    """Refuse (422 ``record_level_not_admitted``) a mechanism that releases one output per
    record (``Mechanism.record_level``) unless the operator opted the dataset in."""
    if mech.record_level and not budget.record_level(doc):
        raise Invalid(RECORD_LEVEL_REFUSED.format(name=mech.name),
                       code="record_level_not_admitted", field="mechanism")


def ledger_measures(measures: Any, doc: dict[str, Any]) -> set[str]:
    """The ledger measures (without columns) a mechanism charging ``measures`` spends on
    this dataset: on a zcdp one every DP measure is charged as ρ (``zcdp.charge``)."""
    out = set(measures)
    if doc.get("gaussian_accounting") == "zcdp" and out & {"epsilon", "delta", "rho"}:
        out = (out - {"epsilon", "delta"}) | {"rho"}
    return out


def check_measures(named: set[str], measures: Any) -> None:
    """Refuse (422 ``measure_not_admitted``, naming it) a release charging a measure the
    dataset's budgets do not name: no measure has a default cap (DESIGN §3). A measure
    without a column (``interval_leakage``) is named when some column's cap is; one with a
    column (``interval_leakage:age``) only by its own cap. The ledger checks it again,
    atomically with the reservation (``Store.reserve``)."""
    bases = {budget.base_measure(m) for m in named}
    for measure in sorted(measures):
        if measure not in (named if ":" in measure else bases):
            raise not_admitted(measure, named)


def not_admitted(measure: str, named: set[str] | None = None) -> ServiceError:
    """422 ``measure_not_admitted``: the dataset's budgets name no cap for ``measure``
    (``measures``: those they name, when known; caps are public, as the budget view)."""
    extra = {} if named is None else {"measures": sorted(named)}
    return Invalid(f"this dataset's budgets name no {measure} cap, so it admits no"
                    " release charging it (the operator names the measure in the budgets);"
                    " nothing was spent", code="measure_not_admitted", field="mechanism",
                    measure=measure, **extra)


def zcdp_delta(doc: dict[str, Any]) -> Fraction:
    """The public δ a zcdp dataset's ρ amounts are converted at (metadata ``zcdp_delta``)."""
    raw = doc.get("zcdp_delta")
    return zcdp.DEFAULT_DELTA if raw is None else budget.to_fraction(raw, "zcdp_delta")


def zcdp_statement(doc: dict[str, Any], rho: Fraction) -> dict[str, Any]:
    """A ρ cost and the (ε, δ)-DP it implies alone (BS16 Prop 1.3), for estimates."""
    return {"rho": float(rho), "approx_dp": zcdp.conversion(rho, zcdp_delta(doc)),
            "conversion": "epsilon = rho + 2 sqrt(rho log(1/delta)) (Bun & Steinke 2016,"
                          " Prop. 1.3)"}


#: ``earlier_releases`` reads at most this many of a dataset's newest releases (work per
#: request); beyond, it ends with ``{"status": "truncated"}`` and nothing is composed
MAX_EARLIER_RELEASES = 256


def earlier_releases(ledger: Store, dataset: dict[str, Any]) -> list[dict[str, Any]]:
    """The dataset's releases (this version) as ``Mechanism.composition`` reads them, oldest
    first: mechanism, params, status, the mechanism's exact ``cost`` per measure, the ledger
    ``units`` it holds and whether a failed one was ``charged`` (failed after reading the
    data). Public designs and statuses only: nothing the data decides."""
    rows, more = ledger.dataset_history(dataset["id"], MAX_EARLIER_RELEASES)
    out: list[dict[str, Any]] = []
    if more:
        out.append({"status": "truncated"})
    for h in rows:
        req = JobRequest.from_json(h["request"])
        if req.dataset_version != dataset.get("version"):
            continue
        out.append({"mechanism": req.mechanism, "params": req.params, "status": h["status"],
                    "cost": req.exact_cost(), "units": req.cost_units,
                    "charged": h.get("charged") == "1"})
    return out


def _budget(raw: Any, where: str = "budget") -> dict[str, Fraction]:
    """A request's amounts, exactly, each on its measure's ledger lattice (rounded down);
    ``where``: the request field they came from (``budget``, or ``target`` for its δ)."""
    if not isinstance(raw, dict) or not raw:
        raise Invalid("budget must be a non-empty object of measure -> amount",
                       code="validation_error", field=where)
    out: dict[str, Fraction] = {}
    for measure, value in raw.items():
        field = f"{where}.{measure}"
        if budget.base_measure(measure) not in budget.MEASURES:
            raise Invalid("unknown measure"
                          + did_you_mean(budget.base_measure(measure), budget.MEASURES)
                          + f"; known: {sorted(budget.MEASURES)}",
                          code="validation_error", field=field)
        try:
            amount = budget.to_fraction(value, field)
        except budget.AmountError as err:
            raise Invalid(err.message, code="validation_error", field=field) from None
        if amount <= 0:
            raise Invalid("must be positive", code="validation_error", field=field)
        ceiling = budget.MEASURES[budget.base_measure(measure)][1]
        if amount > ceiling:  # no cap is ever larger, so no cost could use more
            raise Invalid(f"must be at most {ceiling}", code="validation_error",
                           field=field)
        # the ledger holds whole units, rounded up: an amount below one unit would be
        # charged a unit (more than written), and off the lattice up to a unit more
        smallest = budget.from_units(measure, 1)
        if amount < smallest:
            raise Invalid(f"must be at least {float(smallest):g}, the smallest amount"
                           " of this measure the ledger can charge", code="validation_error",
                           field=field)
        out[measure] = budget.on_lattice(measure, amount)
    return out


def prefixed(prefix: str, messages: Any) -> dict[str, str]:
    if isinstance(messages, dict):
        out: dict[str, str] = {}
        for key, value in messages.items():
            out.update(prefixed(f"{prefix}.{key}", value))
        return out
    if isinstance(messages, list):
        return {prefix: "; ".join(str(m) for m in messages)}
    return {prefix: str(messages)}
