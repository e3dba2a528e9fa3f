"""The contract every mechanism implements.

A mechanism sees three things: parameters (validated by its marshmallow
schema), the dataset's *public* metadata, and the privacy budget the analyst
agreed to spend. Cost and accuracy are functions of those alone, so the
service can charge the ledger and answer dry runs before touching data;
only ``run`` reads the data. A mechanism whose input reduces to sufficient
statistics is a ``StreamingMechanism``: its data pass is a ``Statistic`` (exact,
mergeable partials over batches of rows, ``mechanisms.statistics``) and its
``release`` adds the noise, so any engine can compute the partials in bounded memory.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar, Literal, final

import marshmallow
import numpy as np

from mechanisms.statistics import Partial, Statistic, compute
from mechanisms.suggest import did_you_mean

if TYPE_CHECKING:
    from mechanisms.memory import Memory

ColumnType = Literal["continuous", "integer", "categorical", "functional"]
Budget = Mapping[str, Fraction]


class MechanismInputError(ValueError):
    """Parameters that do not fit the mechanism or the dataset's metadata.

    ``field`` names the offending input (e.g. ``params.column``); the message
    must never contain data values, only public names and parameters.
    """

    #: the problem code the API answers with (an operator policy refusal has its own)
    code: str = "validation_error"

    def __init__(self, field: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        #: public values merged into the problem document (thresholds, design metrics)
        self.extra = extra


class PolicyViolation(MechanismInputError):
    """A request the operator's metadata policy refuses (e.g. a subset design whose
    public risk exceeds a ``subset_policy`` threshold); answered 422 ``policy_violation``."""

    code = "policy_violation"


#: public limits on a numeric column's declared bounds [lo, hi]: beyond them float64
#: arithmetic on the domain (spans, squares, grids of up to a few thousand points,
#: transforms) overflows, underflows or cannot tell grid points apart
MAX_ABS_BOUND = 1e100
#: the smallest span hi - lo, absolutely and relative to max(|lo|, |hi|)
MIN_SPAN = 1e-100
MIN_RELATIVE_SPAN = 1e-9
#: integer bounds stay where every integer is exact in float64 (2**53)
MAX_ABS_INTEGER_BOUND = 2**53


def bounds_problem(lo: float, hi: float, integer: bool = False) -> str | None:
    """Why ``[lo, hi]`` is not a usable numeric domain, or None if it is.

    One rule for the upload (which refuses such metadata) and for the
    mechanisms' cost checks (which see hand-built metadata in a notebook):
    finite, ``lo < hi``, ``|lo|, |hi| <= MAX_ABS_BOUND`` (2**53 for integer
    columns) and ``hi - lo >= max(MIN_SPAN, MIN_RELATIVE_SPAN * max(|lo|, |hi|))``.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "bounds must be finite"
    if not lo < hi:
        return f"lower bound {lo} must be less than upper bound {hi}"
    limit = MAX_ABS_INTEGER_BOUND if integer else MAX_ABS_BOUND
    if max(abs(lo), abs(hi)) > limit:
        return f"bounds must lie within [-{limit:g}, {limit:g}]"
    if integer:
        return None  # integers: the span is at least 1 and every value is exact
    if hi - lo < max(MIN_SPAN, MIN_RELATIVE_SPAN * max(abs(lo), abs(hi))):
        return (f"hi - lo must be at least {MIN_SPAN:g} and at least {MIN_RELATIVE_SPAN:g}"
                " times max(|lo|, |hi|): a narrower domain has too few float64 values")
    return None


def check_numeric_column(column: ColumnMeta, field: str = "params.column") -> tuple[float, float]:
    """The bounds of a numeric column, or MechanismInputError if they are unusable."""
    if column.type not in ("continuous", "integer") or column.bounds is None:
        raise MechanismInputError(field, f"column {column.name!r} needs numeric bounds")
    lo, hi = float(column.bounds[0]), float(column.bounds[1])
    problem = bounds_problem(lo, hi, column.type == "integer")
    if problem is not None:
        raise MechanismInputError(field, f"column {column.name!r}: {problem}")
    return lo, hi


@dataclass(frozen=True)
class ColumnMeta:
    """Public description of one column: its type and declared domain."""

    name: str
    type: ColumnType
    bounds: tuple[float, float] | None = None
    categories: tuple[str, ...] | None = None
    #: public prior of a continuous column, e.g. {"family": "normal", "loc": 0, "scale": 1};
    #: None means uniform on ``bounds`` (interval privacy computes coverage from it). The
    #: families and parameter ranges are ``mechanisms.interval.priors.FAMILIES``/``RANGES``
    prior: Mapping[str, Any] | None = None
    #: functional columns: the public evaluation grid (increasing) and L2 norm bound
    grid: tuple[float, ...] | None = None
    norm_bound: float | None = None
    #: operator thresholds on subset designs for this column (``min_size_coverage``,
    #: ``max_mi_bits``, ``max_prediction_risk``); overrides the dataset's default per key
    subset_policy: Mapping[str, float] | None = None


@dataclass(frozen=True)
class DatasetMeta:
    """Public metadata of a dataset version; ``n_rows`` is public (replace-one DP)."""

    n_rows: int
    columns: Mapping[str, ColumnMeta]
    #: dataset-wide default subset-design thresholds (see ``ColumnMeta.subset_policy``)
    subset_policy: Mapping[str, float] | None = None
    #: microdata keeps the dataset's row order (collection is local by design); by default
    #: the service releases records in a secret per-dataset order (``mechanisms.rows``)
    keep_row_order: bool = False
    #: the operator accepts that some rows serve as a reference that DP does not protect
    #: (DIP's ``holdout``, spec §7.1(b)); off unless the metadata says ``allow_holdout``
    allow_holdout: bool = False
    #: how Gaussian-noise releases are accounted: "approx_dp" (ε, δ) or "zcdp" (ρ, one
    #: budget that pure-ε releases also charge, as ε²/2); see ``mechanisms.zcdp``
    gaussian_accounting: str = "approx_dp"

    def column(self, name: str, field: str = "params.column") -> ColumnMeta:
        """Look up a column or raise an input error naming the field."""
        try:
            return self.columns[name]
        except KeyError:
            raise MechanismInputError(field, f"unknown column {name!r}"
                                      + did_you_mean(name, self.columns)) from None


@dataclass(frozen=True)
class Output:
    """What a run produces: the released values plus what is said about them.

    ``result`` follows DESIGN §4 (``value``; or ``values`` with ``categories``
    / ``bins`` / ``grid``; or ``records``). ``accuracy`` and ``guarantee`` are
    computed from public inputs only.
    """

    result: dict[str, Any]
    accuracy: dict[str, Any]
    guarantee: str
    extra: dict[str, Any] = field(default_factory=dict)
    #: privatized microdata, columnar (name -> 1-D array, one entry per released record,
    #: in the dataset's row order). The service puts the records into the dataset's secret
    #: order (``mechanisms.rows``), stores the table beside the release, serves it as CSV
    #: at GET /v1/releases/{id}/data, hands it to analyses, and copies it into
    #: ``result["records"]`` only when small. Keep ``result`` itself small (summaries).
    table: Mapping[str, np.ndarray] | None = None
    #: the table column holding dataset row indices (a subset of the rows, e.g. DIP's
    #: hold-out); the service replaces them by the rows' secret pseudonyms. None: the
    #: table's i-th record is the i-th row (or a record the mechanism added)
    row_column: str | None = None
    #: False for a table whose entries are not the dataset's records (exm's draws from a
    #: DP distribution): it is released as it is
    per_record: bool = True


@dataclass(frozen=True)
class Work:
    """An upper bound on a task's work, from public inputs only, and what drives it.

    ``units`` are abstract: roughly one per array element an iteration touches
    (iterations x records x cells), so that 10^9 is of the order of a CPU-minute.
    ``field`` names the input a caller can lower (e.g. ``params.max_iter``); the
    service refuses a task whose units exceed its ceiling, naming that field.
    """

    units: float
    field: str
    #: how to fit: e.g. "lower max_iter" (public words only)
    hint: str = ""


@dataclass(frozen=True)
class ReleaseView:
    """A stored release as post-processing sees it: public outputs only, never data."""

    id: str
    mechanism: str
    params: Mapping[str, Any]
    result: Mapping[str, Any]
    table: Mapping[str, np.ndarray] | None
    meta: DatasetMeta


class Analysis(abc.ABC):
    """Free post-processing of a release's output (NPMLE, EM, tests, regression).

    It reads only released outputs (``ReleaseView``), so it spends no budget.
    ``others`` are further releases the caller named (e.g. the second column of
    an independence test), already checked to belong to the same dataset.
    """

    name: ClassVar[str]
    params_schema: ClassVar[type[marshmallow.Schema]]
    #: how many other releases the analysis takes (``params.releases``)
    n_others: ClassVar[int] = 0

    def load_params(self, raw: Any) -> dict[str, Any]:
        loaded: dict[str, Any] = _schema(self.params_schema).load(raw or {})
        return loaded

    def offered_by(self, mechanism: str) -> bool:
        """Whether any release of ``mechanism`` can run this analysis (the catalog lists
        only those); ``applies`` then decides per release."""
        return True

    def applies(self, mechanism: str, params: Mapping[str, Any],
                result: Mapping[str, Any]) -> bool:
        """Whether a succeeded release (its params and result, no table) can run this
        analysis at all; releases list only those that can."""
        return True

    def check(self, release: ReleaseView, params: Mapping[str, Any],
              others: list[ReleaseView]) -> None:
        """Raise MechanismInputError (naming the field) for a request that ``run`` would
        refuse, before it is queued: the release's design, the table's shape (public
        outputs; tables are memory-mapped, so read only the columns needed)."""
        if not self.applies(release.mechanism, release.params, release.result):
            raise MechanismInputError("analysis", f"{self.name} does not apply to this"
                                      " release's design")

    def work(self, release: ReleaseView, params: Mapping[str, Any],
             others: list[ReleaseView]) -> Work:
        """Upper bound on the work of ``run`` (see :class:`Work`); call after ``check``.
        The default is one pass over the released records."""
        return Work(float(release.meta.n_rows), "release")

    @abc.abstractmethod
    def run(self, release: ReleaseView, params: Mapping[str, Any],
            others: list[ReleaseView], rng: np.random.Generator) -> dict[str, Any]:
        """The analysis result as JSON-ready data (include diagnostics and warnings)."""


#: params whose value multiplies a release's work (see ``Mechanism.work``)
SIZE_PARAMS = ("grid_size", "lattice_size", "bins", "m", "rounds", "max_components",
               "resolution")

#: budgets above this are refused as absurd (the release would be essentially exact)
MAX_EPSILON = Fraction(100)

#: the ledger's quantum per measure (units per 1.0): an amount is held as a whole number
#: of units, so one below a unit cannot be charged as written (it would be rounded up to a
#: unit, more than the caller agreed to) and is refused; it also keeps 1/amount finite in
#: float64 (a subnormal epsilon overflowed the exact rounding helpers)
LEDGER_UNITS: dict[str, int] = {
    "epsilon": 10**9, "delta": 10**15, "rho": 10**12, "noiseless_bits": 10**9,
    "interval_leakage": 10**12, "subset_draws": 1,
}


def smallest(measure: str) -> Fraction:
    """The smallest positive amount of ``measure`` (``interval_leakage:age`` too)."""
    return Fraction(1, LEDGER_UNITS[measure.split(":", 1)[0]])


#: smaller δ are refused: below one ledger unit (1e-15) it can not be charged as written
MIN_DELTA = smallest("delta")


def read_number(value: object, field: str) -> Fraction:
    """A budget amount exactly as given: a finite int, Fraction or float (never a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Rational | float):
        raise MechanismInputError(field, "must be a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise MechanismInputError(field, "must be finite")
    return Fraction(value)


def check_range(amount: Fraction, measure: str, ceiling: Fraction, field: str) -> Fraction:
    """``amount`` if it lies in [smallest(measure), ceiling], else a 422 naming ``field``."""
    if not 0 < amount <= ceiling:
        raise MechanismInputError(field, f"{measure.split(':', 1)[0]} must be in (0, {ceiling}]")
    floor = smallest(measure)
    if amount < floor:
        raise MechanismInputError(field, f"must be at least {float(floor):g}: the smallest"
                                  " amount of this measure the ledger can charge")
    return amount


def read_amount(budget: Mapping[str, object], measure: str, ceiling: Fraction,
                missing: str) -> Fraction:
    """The one amount a single-measure budget holds, exactly: a finite number in
    [smallest(measure), ``ceiling``] (``missing``: the message when it is absent)."""
    field = f"budget.{measure}"
    if measure not in budget:
        raise MechanismInputError(field, missing)
    return check_range(read_number(budget[measure], field), measure, ceiling, field)


def read_epsilon(budget: Budget, name: str) -> Fraction:
    """A pure-DP mechanism's budget: exactly ``{"epsilon": ε}`` with 0 < ε <= MAX_EPSILON."""
    extra = sorted(set(budget) - {"epsilon"})
    if extra:
        raise MechanismInputError("budget", f"{name} spends only epsilon; got {', '.join(extra)}")
    return read_amount(budget, "epsilon", MAX_EPSILON, f"{name} needs an epsilon budget")


def read_budget(budget: Budget, measures: tuple[str, ...], name: str) -> dict[str, Fraction]:
    """The budget as exact fractions; exactly ``measures``, each in range."""
    extra = sorted(set(budget) - set(measures))
    if extra:
        raise MechanismInputError(
            "budget", f"{name} spends only {', '.join(measures)}; got {', '.join(extra)}"
        )
    amounts: dict[str, Fraction] = {}
    for measure in measures:
        if measure not in budget:
            raise MechanismInputError(f"budget.{measure}", f"{name} needs a {measure} budget")
        amounts[measure] = read_number(budget[measure], f"budget.{measure}")
    check_range(amounts["epsilon"], "epsilon", MAX_EPSILON, "budget.epsilon")
    if "delta" in amounts and not MIN_DELTA <= amounts["delta"] < 1:
        raise MechanismInputError("budget.delta", f"delta must be in [{float(MIN_DELTA)}, 1)")
    return amounts


@functools.cache
def _schema(cls: type[marshmallow.Schema]) -> marshmallow.Schema:
    """One instance per schema class: building a schema costs more than loading with it."""
    return cls()


@dataclass(frozen=True)
class Composed:
    """A release's ledger charge given the dataset's earlier releases
    (``Mechanism.composed``), the one function the service and the audit price through.

    ``charge``: what the ledger holds on the measures it names (interval releases: the
    standalone cost, Thm 4, sound for designs chosen after earlier outputs);
    ``report``: what ``accuracy.composition`` shows (None: nothing); ``privacy``: what
    the release's ``privacy`` block records about the charge.
    """

    charge: Mapping[str, Fraction]
    report: dict[str, Any] | None
    privacy: dict[str, Any]


#: words a period ends without ending the sentence ("i.i.d. draws", "Bun et al. (2016)")
_ABBREVIATIONS = frozenset({"al", "cf", "e.g", "eq", "eqs", "etc", "fig", "i.e", "i.i.d",
                            "no", "resp", "sec", "vs", "w.r.t"})
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\[`])")


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` (whitespace collapsed): ends at a period, ``!`` or
    ``?`` followed by a capital, unless the word before it is an abbreviation, so a
    mechanism's summary is not cut at "i.i.d." or "et al."."""
    text = " ".join(text.split())
    for end in _SENTENCE_END.finditer(text):
        word = text[:end.start()].rsplit(" ", 1)[-1].rstrip(".!?").lower()
        if word not in _ABBREVIATIONS and not (len(word) == 1 and word.isalpha()):
            return text[:end.start()]
    return text


class Mechanism(abc.ABC):
    """One registry entry: schema, cost, accuracy and the randomized run."""

    name: ClassVar[str]
    #: privacy measures this mechanism charges (keys of the budget/cost dicts)
    measures: ClassVar[tuple[str, ...]]
    #: marshmallow schema of ``params``; unknown fields are rejected
    params_schema: ClassVar[type[marshmallow.Schema]]
    description: ClassVar[str] = ""
    #: free post-processing available on this mechanism's releases, by name
    analyses: ClassVar[Mapping[str, Analysis]] = {}
    #: whether its cost reads a ρ budget on a zcdp dataset (``mechanisms.zcdp``); a
    #: mechanism charging δ without it is refused there (pure-ε ones charge ε²/2)
    zcdp_native: ClassVar[bool] = False
    #: whether it releases one output per record (privatized microdata: subset and
    #: interval releases, noiseless.local, DIP, ...): a dataset refuses it unless its
    #: operator opted in with metadata ``record_level: true``. A new mechanism declares it
    #: here, in its own class; the service keeps no list
    record_level: ClassVar[bool] = False
    #: the run's own allocation per row held, in bytes, beyond the loaded columns, and per
    #: cell of the columns its params name (``mechanisms.memory``); measured per family by
    #: ``tests/memory_probe.py``. The defaults are above every family measured
    row_bytes: ClassVar[float] = 1024.0
    cell_bytes: ClassVar[float] = 32.0
    #: the run's allocation that does not grow with rows (plans, calibrations), in bytes
    fixed_bytes: ClassVar[float] = 16 * 2**20

    def writes_table(self, params: Mapping[str, Any]) -> bool:
        """Whether a run may return a table (``Output.table``), known from ``params``
        alone. The worker stores a table as a file, so before such a run reads the data
        it checks that the output store can take one (a store that cannot is refunded,
        not charged). Record-level releases do; an aggregate that draws a table (exm)
        says so in its own class."""
        return self.record_level

    def charged_columns(self, params: Mapping[str, Any]) -> tuple[str, ...]:
        """The per-column ledger measures (``interval_leakage:age``) a release will charge,
        known from ``params`` alone, so the service refuses one its dataset does not name
        before any pricing; () when it charges none or knows them only once priced."""
        return ()

    def load_params(self, raw: Any) -> dict[str, Any]:
        """Validate ``params`` against the schema (raises marshmallow.ValidationError)."""
        loaded: dict[str, Any] = _schema(self.params_schema).load(raw or {})
        return loaded

    def with_history(self, params: dict[str, Any],
                     committed: Callable[[], Mapping[str, Fraction]]) -> dict[str, Any]:
        """Complete ``params`` from the ledger's public history before costing.

        ``committed()`` reads what earlier releases of the dataset committed or still
        hold (queued jobs), per ledger measure (only when called). Most mechanisms
        need none of it; one whose guarantee depends on earlier draws (subset
        privacy's composed design) reads it here.
        """
        return params

    def work(self, params: Mapping[str, Any], meta: DatasetMeta) -> Work:
        """Upper bound on the work of ``run`` from public inputs (see :class:`Work`).

        The default: a pass over the rows per point of the largest size the params ask
        for (grid, lattice, bins, cells, rounds, components) or of the evaluation grid
        of a functional column they name; releases are vectorized passes over the data.
        A mechanism whose run iterates otherwise overrides it.
        """
        size, field = 1, "dataset_id"
        for name in SIZE_PARAMS:
            value = params.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > size:
                size, field = value, f"params.{name}"
        column = meta.columns.get(str(params.get("column")))
        if column is not None and column.grid and len(column.grid) > size:
            size, field = len(column.grid), "params.column"
        return Work(float(max(meta.n_rows, 1)) * size, field)

    def memory(self, params: Mapping[str, Any], meta: DatasetMeta) -> Memory:
        """Upper bound on the worker's peak allocation for ``run`` from public inputs (see
        ``mechanisms.memory``): the loaded columns, ``row_bytes`` per row and ``cell_bytes``
        per named cell, and ``fixed_bytes``; a streaming mechanism holds one row group of
        its columns instead."""
        from mechanisms import memory  # it builds on this module's types

        return memory.bound(params, meta, streaming=isinstance(self, StreamingMechanism),
                             row_bytes=self.row_bytes, cell_bytes=self.cell_bytes,
                             fixed_bytes=self.fixed_bytes)

    def composition(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                    earlier: Callable[[], Sequence[Mapping[str, Any]]]) -> dict[str, Any] | None:
        """How this release composes with the dataset's earlier releases, for display in
        its accuracy (``composition``); None: nothing to say. ``earlier()`` lists them
        (``mechanism``, ``params``, ``status``, exact ``cost`` per measure). It never
        changes the charge and never refuses."""
        return None

    def composed(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 earlier: Callable[[], Sequence[Mapping[str, Any]]]) -> Composed | None:
        """The ledger charge given the dataset's earlier releases (``earlier()`` as in
        ``composition``, plus ``units`` and ``charged``), with the composition report and
        the ``privacy`` block's entry (interval releases); None: the cost is charged and
        ``composition`` is shown."""
        return None

    def reference_datasets(self, params: Mapping[str, Any]) -> list[str]:
        """Ids of public datasets a run reads as reference data (DIP's ``public``)."""
        return []

    def check_reference(self, params: Mapping[str, Any], meta: DatasetMeta,
                        public: DatasetMeta) -> None:
        """Raise MechanismInputError if a public reference does not fit ``meta``."""
        return None

    def bind_references(
        self, params: Mapping[str, Any],
        references: Mapping[str, tuple[DatasetMeta, Mapping[str, np.ndarray]]],
    ) -> dict[str, Any]:
        """Params for ``run`` with the referenced public data attached (worker side)."""
        return dict(params)

    @abc.abstractmethod
    def cost(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta) -> dict[
        str, Fraction
    ]:
        """Exact cost per measure, from public inputs only; at most ``budget``.

        Raises MechanismInputError for a budget that names the wrong measures
        or for params that do not fit the metadata (unknown column, wrong type).
        """

    @abc.abstractmethod
    def accuracy(
        self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta
    ) -> dict[str, Any]:
        """Accuracy statement (noise scale, 95% half-width, ...) from public inputs."""

    def price(self, params: Mapping[str, Any], budget: Budget, meta: DatasetMeta
              ) -> tuple[dict[str, Fraction], dict[str, Any]]:
        """``cost`` and then ``accuracy`` of that cost, as a pricing calls them both; a
        mechanism whose two share work (a calibration) may do it once here."""
        cost = self.cost(params, budget, meta)
        return cost, self.accuracy(params, cost, meta)

    def statistic(self, params: Mapping[str, Any], cost: Budget,
                  meta: DatasetMeta) -> Statistic | None:
        """The sufficient statistic ``run`` reduces the data to (``StreamingMechanism``),
        or None: ``run`` reads whole columns."""
        return None

    @abc.abstractmethod
    def run(
        self,
        data: Mapping[str, np.ndarray],
        params: Mapping[str, Any],
        cost: Budget,
        meta: DatasetMeta,
        rng: np.random.Generator,
    ) -> Output:
        """Compute the privatized output; the only method that reads ``data``.

        ``data`` maps column names to 1-D arrays of length ``meta.n_rows``:
        float64 for continuous, int64 for integer, int64 category codes
        (indices into ``ColumnMeta.categories``) for categorical columns.
        """


class StreamingMechanism(Mechanism):
    """A mechanism whose data pass is a ``Statistic`` and whose noise step is ``release``.

    ``run`` is final: one update of the statistic over the whole data, then ``release``,
    so the whole-column path and a streamed one (batches updated anywhere, partials
    merged in any order) share the code and give the same output with the same generator.
    """

    #: per row of the held row group, the batch read and the passes' temporaries
    #: (measured: laplace mean, quantile, variance, a 3-way cross-tab, a median)
    row_bytes: ClassVar[float] = 80.0
    cell_bytes: ClassVar[float] = 16.0
    fixed_bytes: ClassVar[float] = 2**20

    @abc.abstractmethod
    def statistic(self, params: Mapping[str, Any], cost: Budget,
                  meta: DatasetMeta) -> Statistic:
        """The (first pass of the) statistic ``release`` reads, from public inputs only."""

    @abc.abstractmethod
    def release(self, params: Mapping[str, Any], partial: Partial, cost: Budget,
                meta: DatasetMeta, rng: np.random.Generator,
                statistic: Statistic | None = None) -> Output:
        """The privatized output from the last pass's merged partial (the noise step).
        ``statistic``: that last pass, when the caller has it (its plan is this
        release's: made from the same public inputs, so it need not be made again)."""

    def stream(self, batches: Sequence[Mapping[str, np.ndarray]], params: Mapping[str, Any],
               cost: Budget, meta: DatasetMeta, rng: np.random.Generator) -> Output:
        """``run`` over batches of rows (all passes read them, each pass once)."""
        last, partial = compute(self.statistic(params, cost, meta), batches)
        return self.release(params, partial, cost, meta, rng, last)

    @final
    def run(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any], cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Output:
        return self.stream([data], params, cost, meta, rng)


class RecordMechanism(Mechanism):
    """A record-level mechanism whose table is a row map: each record's output depends
    only on public inputs, a fitted model and the record itself (issue #30 item 4).

    So the rows can be privatized in partitions anywhere (an engine's workers, a loop
    over row groups), each with its own generator: ``privatize(rows, start, ..., rng)``
    maps the rows ``start, start + 1, ...`` of the dataset to their released records
    and reads nothing else. A map that needs a public-after-noise quantity (DIP's noisy
    histogram) first computes ``fit_statistic`` (exact partials, any engine) and
    ``fit`` releases the model from it with noise from the job's generator; the model
    goes to every partition. ``summary`` is an exact statistic of the released records
    (their means: post-processing) and ``describe`` writes the output around the table.

    A model whose noise must come before a second exact pass (DIP's copula) adds it with
    ``refit_statistic`` and ``refit``. ``run`` is the same steps over one partition with
    one generator: fit (and refit), then the map,
    so a partitioned run differs from it only in which generator draws each record's
    noise (independent streams: the same distribution, ``mechanisms.rng``).
    ``mappable`` says when params fall outside the map (DIP's hold-out samples rows
    themselves): those run whole columns through ``run_whole``.
    """

    #: a row map's own allocation per row of the table it builds (``mechanisms.memory``;
    #: measured per family by ``tests/memory_probe.py``), and what does not grow with rows
    map_row_bytes: ClassVar[float] = 256.0
    map_fixed_bytes: ClassVar[float] = 4 * 2**20

    def memory(self, params: Mapping[str, Any], meta: DatasetMeta) -> Memory:
        """A row map holds a row group of the columns it reads and the table it builds
        (``mechanisms.memory``); params outside the map read whole columns."""
        if not self.mappable(params, meta):
            return super().memory(params, meta)
        from mechanisms import memory  # it builds on this module's types

        out = memory.bound(params, meta, streaming=False, mapped=True,
                           row_bytes=self.map_bytes(params, meta)[0], cell_bytes=self.cell_bytes,
                           fixed_bytes=self.map_fixed_bytes)
        batch = min(max(meta.n_rows, 0), memory.BATCH_ROWS) * self.map_bytes(params, meta)[1]
        return dataclasses.replace(out, bytes=out.bytes + batch)

    def map_bytes(self, params: Mapping[str, Any], meta: DatasetMeta) -> tuple[float, float]:
        """(bytes per row of the table the map builds, bytes per row of a batch it
        privatizes at once beyond that): ``map_row_bytes`` and none, unless the params
        widen the table or the draws (public inputs only)."""
        return self.map_row_bytes, 0.0

    #: the table column holding each record's dataset row (``Output.row_column``), which
    #: an engine ordering the records replaces by their released positions; None: none
    record_row_column: ClassVar[str | None] = None

    def mappable(self, params: Mapping[str, Any], meta: DatasetMeta) -> bool:
        """Whether a release of these params is a row map (public inputs only)."""
        return True

    def mapped_columns(self, params: Mapping[str, Any], meta: DatasetMeta) -> tuple[str, ...]:
        """The columns ``privatize`` reads (default: ``params.columns``, else
        ``params.column``)."""
        names = params.get("columns")
        return tuple(names) if names is not None else (str(params["column"]),)

    def fit_statistic(self, params: Mapping[str, Any], cost: Budget,
                      meta: DatasetMeta) -> Statistic | None:
        """The first pass the fit reads (None: the model needs no data)."""
        return None

    def fit(self, params: Mapping[str, Any], partial: Partial | None, cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Any:
        """The public-after-noise model of the map (picklable: it goes to the workers),
        from the fit statistic's last partial (None without one), noise from ``rng``."""
        return None

    def refit_statistic(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                        model: Any) -> Statistic | None:
        """A second fit pass that reads the noised model (DIP's copula: the correlation
        sums under its released marginals); None: ``fit``'s model is the map's."""
        return None

    def refit(self, params: Mapping[str, Any], model: Any, partial: Partial, cost: Budget,
              meta: DatasetMeta, rng: np.random.Generator) -> Any:
        """The map's model from ``fit``'s and the second pass's last partial, noise from
        ``rng`` (after ``fit``'s draws)."""
        return model

    @abc.abstractmethod
    def privatize(self, rows: Mapping[str, np.ndarray], start: int,
                  params: Mapping[str, Any], cost: Budget, meta: DatasetMeta, model: Any,
                  rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The released records of dataset rows ``start .. start + len(rows) - 1`` (one
        per row, in their order), noise from ``rng``; the table's columns."""

    def summary(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                model: Any) -> Statistic | None:
        """An exact statistic of the released table's batches for ``describe`` (None:
        it reads none)."""
        return None

    @abc.abstractmethod
    def describe(self, params: Mapping[str, Any], cost: Budget, meta: DatasetMeta,
                 model: Any, released: Partial | None) -> Output:
        """The output without its table: result, accuracy, guarantee, ``row_column``
        (``released``: the summary's partial over the whole table)."""

    def run_whole(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any],
                  cost: Budget, meta: DatasetMeta, rng: np.random.Generator) -> Output:
        """The run of params that are not a row map (``mappable`` False)."""
        raise NotImplementedError(f"{self.name} releases every request as a row map")

    def run(self, data: Mapping[str, np.ndarray], params: Mapping[str, Any], cost: Budget,
            meta: DatasetMeta, rng: np.random.Generator) -> Output:
        if not self.mappable(params, meta):
            return self.run_whole(data, params, cost, meta, rng)
        for name, values in data.items():  # a partitioned run counts the rows it read
            if np.ndim(values) == 0 or len(values) != meta.n_rows:
                raise ValueError(f"column {name!r} does not have n_rows entries")
        statistic = self.fit_statistic(params, cost, meta)
        partial = None if statistic is None else compute(statistic, [data])[1]
        model = self.fit(params, partial, cost, meta, rng)
        second = self.refit_statistic(params, cost, meta, model)
        if second is not None:
            model = self.refit(params, model, compute(second, [data])[1], cost, meta, rng)
        table = self.privatize(data, 0, params, cost, meta, model, rng)
        summary = self.summary(params, cost, meta, model)
        released = None if summary is None else compute(summary, [table])[1]
        output = self.describe(params, cost, meta, model, released)
        return dataclasses.replace(output, table=table)


def batch_columns(rows: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """``names`` of a batch of rows as 1-D arrays of one length (ValueError naming the
    first column that is not)."""
    out = {name: np.asarray(rows[name]) for name in names}
    lengths = {len(x) if x.ndim == 1 else -1 for x in out.values()}
    if -1 in lengths or len(lengths) > 1:
        bad = next(n for n, x in out.items() if x.ndim != 1 or len(x) != len(out[names[0]]))
        raise ValueError(f"column {bad!r} is not a 1-D column of the batch's rows")
    return out
