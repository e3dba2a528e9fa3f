"""Interval mechanisms: random partitions, assignment of Y, and the released records.

A mechanism is split the way the proofs split it (Thm 3): a random partition
whose anchors are drawn **without seeing Y** (``Partition.sample`` takes no
data), then a deterministic assignment of Y to its range. The split is what
makes the posterior the prior restricted to the range (Def 1), and it lets
coverage be integrated over anchors alone.

Mechanisms here: canonical Case-I / Case-II / Case-K (iid sorted anchors or a
random shift of fixed offsets; optional exact-report range A, as anchor cells
or a fixed interval), the ring (Example 3), selective collection (Def 5) and
progressive narrowing (Example 4); any of the partition mechanisms can run on
g(Y) and release pre-images (Thm 5).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.interval.anchors import AnchorDist
from mechanisms.interval.ranges import FloatArray, Law, Pieces
from mechanisms.interval.transforms import Transform

IntArray = NDArray[np.int64]


# --------------------------------------------------------------------------- partitions


class Partition(abc.ABC):
    """A random partition of the (g-)line into ``m`` ranges, fixed by ``k`` anchors."""

    m: int
    #: anchors per record (table columns)
    k: int
    #: uniforms per record that ``anchors`` maps to a draw (quasi-Monte Carlo dimension)
    dims: int

    @abc.abstractmethod
    def anchors(self, q: FloatArray) -> FloatArray:
        """Anchors (N, k) from uniforms (N, dims): the anchor law as a transport map."""

    def sample(self, rng: np.random.Generator, n: int) -> FloatArray:
        """n independent anchor draws; no data in sight."""
        return self.anchors(rng.random((n, self.dims)))

    @abc.abstractmethod
    def index(self, z: FloatArray, anchors: FloatArray) -> IntArray:
        """1-based index of the range holding z (ties go left: (l, r])."""

    @abc.abstractmethod
    def cell(self, anchors: FloatArray, index: IntArray) -> Pieces:
        """Range ``index`` of each record's partition, on the g-scale."""

    def edges(self, anchors: FloatArray) -> FloatArray | None:
        """Sorted cell edges when every range is one interval (fast coverage), else None."""
        return None

    def locate(self, z: FloatArray, anchors: FloatArray) -> tuple[IntArray, Pieces]:
        """Index and range of each z at once (subclasses fuse the two passes)."""
        index = self.index(z, anchors)
        return index, self.cell(anchors, index)

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Canonical(Partition):
    """Definition 2: m − 1 sorted anchors cut the line into (U^(i−1), U^(i)].

    ``offsets=None``: the anchors are m − 1 iid draws from ``dist``, sorted
    (Case-II's ordered pair when m = 3). Otherwise one draw U shifted by the
    fixed sorted ``offsets`` (e.g. [−1, 1]: the paper's M1 window).
    """

    dist: AnchorDist
    m: int = 2
    offsets: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.m < 2:
            raise ValueError("a canonical partition has at least two ranges")
        if self.offsets is not None and (
            len(self.offsets) != self.m - 1 or list(self.offsets) != sorted(set(self.offsets))
        ):
            raise ValueError("offsets must be m − 1 strictly increasing numbers")

    @property
    def k(self) -> int:  # type: ignore[override]
        return self.m - 1

    @property
    def dims(self) -> int:  # type: ignore[override]
        return 1 if self.offsets is not None else self.m - 1

    def anchors(self, q: FloatArray) -> FloatArray:
        if self.offsets is not None:
            out: FloatArray = self.dist.ppf(q[:, :1]) + np.asarray(self.offsets)
            return out
        return _sorted_rows(self.dist.ppf(q))

    def sample(self, rng: np.random.Generator, n: int) -> FloatArray:
        if self.offsets is not None:
            out: FloatArray = self.dist.sample(rng, (n, 1)) + np.asarray(self.offsets)
            return out
        # drawn as (k, n) and transposed: each anchor column is contiguous in memory
        return _sorted_rows(self.dist.sample(rng, (self.m - 1, n)).T)

    def index(self, z: FloatArray, anchors: FloatArray) -> IntArray:
        k = anchors.shape[1]
        if k <= 3:  # a few vector comparisons beat a (n, k) temporary
            count = np.ones(z.shape, np.int64)
            for j in range(k):
                count += anchors[:, j] < z
            return count
        out: IntArray = 1 + np.count_nonzero(anchors < z[:, None], axis=1).astype(np.int64)
        return out

    def cell(self, anchors: FloatArray, index: IntArray) -> Pieces:
        k = anchors.shape[1]
        if k <= 3:
            left = np.full(index.shape, -np.inf)
            right = np.full(index.shape, np.inf)
            for j in range(k):
                np.copyto(right, anchors[:, j], where=index == j + 1)
                np.copyto(left, anchors[:, j], where=index == j + 2)
            return Pieces.single(left, right, False, True)
        edges = self.edges(anchors)
        rows = np.arange(anchors.shape[0])
        return Pieces.single(edges[rows, index - 1], edges[rows, index], False, True)

    def locate(self, z: FloatArray, anchors: FloatArray) -> tuple[IntArray, Pieces]:
        k = anchors.shape[1]
        if k > 8:
            return super().locate(z, anchors)
        # anchors are sorted: the last anchor below z is the left end, the first at or
        # above z the right end (ties go left)
        above = [z > anchors[:, j] for j in range(k)]
        left = np.where(above[0], anchors[:, 0], -np.inf)
        index = above[0].astype(np.int64)
        for j in range(1, k):
            left = np.where(above[j], anchors[:, j], left)
            index += above[j]
        index += 1
        right = np.where(above[k - 1], np.inf, anchors[:, k - 1])
        for j in range(k - 2, -1, -1):
            right = np.where(above[j], right, anchors[:, j])
        return index, Pieces.single(left, right, False, True)

    def edges(self, anchors: FloatArray) -> FloatArray:
        n = anchors.shape[0]
        return np.hstack([np.full((n, 1), -np.inf), anchors, np.full((n, 1), np.inf)])

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"partition": "canonical", "m": self.m,
                               "anchors": self.dist.describe()}
        out["arrangement"] = "iid_sorted" if self.offsets is None else "offsets"
        if self.offsets is not None:
            out["offsets"] = list(self.offsets)
        return out


def _sorted_rows(a: FloatArray) -> FloatArray:
    if a.shape[1] == 1:
        return a
    if a.shape[1] == 2:
        out = np.empty_like(a)
        np.minimum(a[:, 0], a[:, 1], out=out[:, 0])
        np.maximum(a[:, 0], a[:, 1], out=out[:, 1])
        return out
    return np.sort(a, axis=1)


@dataclass(frozen=True)
class Ring(Partition):
    """Example 3 with q = 2: ranges (T1, T2] and the wrap-around (−∞, T1] ∪ (T2, ∞).

    Sampled on the quantile circle of the prior (spec §2.5): s ~ U(0, 1),
    w ~ U[τ, 1 − τ]; the middle range has prior mass w or 1 − w, so both
    ranges have coverage >= τ under the prior, for every record.
    """

    law: Law
    tau_floor: float = 0.25
    m: int = 2
    k: int = 2
    dims: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.tau_floor < 0.5:
            raise ValueError("the ring's floor must be in [0, 1/2)")

    def anchors(self, q: FloatArray) -> FloatArray:
        s = q[:, 0]
        w = self.tau_floor + (1.0 - 2.0 * self.tau_floor) * q[:, 1]
        e = s + w
        wrap = e > 1.0
        q1 = np.where(wrap, e - 1.0, s)
        q2 = np.where(wrap, s, e)
        out: FloatArray = np.stack([self.law.ppf(q1), self.law.ppf(q2)], axis=1)
        return out

    def index(self, z: FloatArray, anchors: FloatArray) -> IntArray:
        middle = (anchors[:, 0] < z) & (z <= anchors[:, 1])
        return np.where(middle, 2, 1).astype(np.int64)

    def cell(self, anchors: FloatArray, index: IntArray) -> Pieces:
        n = anchors.shape[0]
        t1, t2 = anchors[:, 0], anchors[:, 1]
        middle = index == 2
        nan = np.full(n, np.nan)
        first = Pieces.single(np.where(middle, t1, -np.inf), np.where(middle, t2, t1))
        second = Pieces.single(np.where(middle, nan, t2), np.where(middle, nan, np.inf))
        return Pieces.concat([first, second])

    def describe(self) -> dict[str, Any]:
        return {"partition": "ring", "m": 2, "tau_floor": self.tau_floor,
                "anchors": "prior quantile circle: s ~ U(0,1), w ~ U[tau, 1-tau]"}


# --------------------------------------------------------------------------- released records


@dataclass(frozen=True)
class Release:
    """Released records, one per input row: anchors, index, ranges, exact values."""

    anchors: FloatArray
    index: IntArray
    pieces: Pieces
    exact: FloatArray
    released: NDArray[np.bool_]
    extra: Mapping[str, NDArray[Any]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.index.shape[0])

    def contains(self, y: ArrayLike) -> NDArray[np.bool_]:
        """Fidelity: the released range (or exact value) holds the truth."""
        y = np.asarray(y, dtype=np.float64)
        is_exact = ~np.isnan(self.exact)
        out: NDArray[np.bool_] = np.where(
            is_exact, self.exact == y, ~self.released | self.pieces.contains(y)
        )
        return out

    def coverage(self, law: Law) -> FloatArray:
        """Individual coverage L(S_z): 0 for an exact report, 1 for a null record."""
        mass = self.pieces.mass(law)
        out: FloatArray = np.where(~np.isnan(self.exact), 0.0, np.where(self.released, mass, 1.0))
        return out

    def table(self, law: Law | None = None) -> dict[str, NDArray[Any]]:
        """Columnar records (the release's microdata), in input row order."""
        out: dict[str, NDArray[Any]] = {}
        for j in range(self.anchors.shape[1]):
            out[f"anchor_{j + 1}"] = self.anchors[:, j]
        out["index"] = self.index
        p = self.pieces
        for j in range(p.width):
            suffix = "" if j == 0 else f"_{j + 1}"
            out[f"left{suffix}"] = p.left[:, j]
            out[f"right{suffix}"] = p.right[:, j]
            out[f"left_closed{suffix}"] = p.left_closed[:, j].astype(np.int64)
            out[f"right_closed{suffix}"] = p.right_closed[:, j].astype(np.int64)
        out["exact"] = self.exact
        out["released"] = self.released.astype(np.int64)
        out.update(self.extra)
        if law is not None:
            out["coverage"] = self.coverage(law)
        return out


def pieces_from_table(table: Mapping[str, ArrayLike]) -> Pieces:
    """Inverse of the piece columns of ``Release.table``."""
    parts = []
    j = 1
    while True:
        suffix = "" if j == 1 else f"_{j}"
        if f"left{suffix}" not in table:
            break
        parts.append(Pieces.single(
            np.asarray(table[f"left{suffix}"], dtype=np.float64),
            np.asarray(table[f"right{suffix}"], dtype=np.float64),
            np.asarray(table[f"left_closed{suffix}"]).astype(bool),
            np.asarray(table[f"right_closed{suffix}"]).astype(bool),
        ))
        j += 1
    if not parts:
        raise ValueError("the table has no range columns")
    return Pieces.concat(parts)


# --------------------------------------------------------------------------- mechanisms


def clean(y: ArrayLike, support: tuple[float, float], fill: float) -> FloatArray:
    """Data as the mechanism sees it: clipped to the declared support, NaN -> ``fill``."""
    v = np.asarray(y, dtype=np.float64)
    v = np.where(np.isnan(v), fill, v)
    out: FloatArray = np.clip(v, support[0], support[1])
    return out


@dataclass(frozen=True)
class IntervalMechanism:
    """A partition mechanism on g(Y), released on the data scale (Defs 2/4, Thm 5).

    ``support`` is the declared data domain (ranges are clipped to it, closed at a
    finite bound); ``exact_cells`` (1-based range indices) and ``exact_range``
    (a closed interval [a, b] of the data scale) form the acceptable range A.
    """

    partition: Partition
    transform: Transform = field(default_factory=Transform)
    support: tuple[float, float] = (-math.inf, math.inf)
    exact_cells: tuple[int, ...] = ()
    exact_range: tuple[float, float] | None = None

    @property
    def dims(self) -> int:
        return self.partition.dims

    @property
    def piece_width(self) -> int:
        """The most pieces of a released range, from the design alone: the partition's
        cells, doubled by an even transform's two preimages and again by an exact range
        cut out of each piece. A row map pads every record to it (``Pieces.padded``), so
        a table's columns never depend on which ranges the rows drew."""
        cells = self.partition.cell(np.zeros((0, self.dims)), np.zeros(0, np.int64)).width
        even = 2 if self.transform.name in ("square", "abs") else 1
        return cells * even * (2 if self.exact_range is not None else 1)

    @property
    def m(self) -> int:
        return self.partition.m

    def ranges(self, anchors: FloatArray, index: IntArray) -> Pieces:
        """Data-scale range (without A) of cell ``index`` for each record."""
        p = self.transform.preimage(self.partition.cell(anchors, index))
        p = p.clip(*self.support)
        if self.exact_range is not None:
            p = p.minus(*self.exact_range)
        return p

    def sample_anchors(self, rng: np.random.Generator, n: int) -> FloatArray:
        return self.partition.sample(rng, n)

    def assign(self, y: ArrayLike, anchors: FloatArray) -> Release:
        """Deterministic part: the range of each y given its anchors."""
        y = np.asarray(y, dtype=np.float64)
        z = self.transform.forward(y)
        index, cell = self.partition.locate(z, anchors)
        pieces = self.transform.preimage(cell).clip(*self.support)
        if self.exact_range is not None:
            pieces = pieces.minus(*self.exact_range)
        exact_mask = np.isin(index, self.exact_cells) if self.exact_cells else np.zeros(
            y.shape, bool)
        if self.exact_range is not None:
            exact_mask |= (y >= self.exact_range[0]) & (y <= self.exact_range[1])
        exact = np.where(exact_mask, y, np.nan)
        extra: dict[str, NDArray[Any]] = {}
        if isinstance(self.partition, Canonical) and self.partition.m in (2, 3):
            # the paper's compact form (u, δ) / (u, v, δ, γ); int8 views of the masks
            extra["delta"] = (index == 1).view(np.int8)
            if self.partition.m == 3:
                extra["gamma"] = (index == 2).view(np.int8)
        return Release(anchors, index, pieces, exact, np.ones(y.shape, bool), extra)

    def release(self, y: ArrayLike, rng: np.random.Generator) -> Release:
        """Privatize y (already clean): anchors first, independently of y, then assign."""
        y = np.asarray(y, dtype=np.float64)
        anchors = self.sample_anchors(rng, y.shape[0])
        return self.assign(y, anchors)

    def cell_coverage(self, anchors: FloatArray, law: Law) -> FloatArray:
        """(N, m): P_Y(R_i \\ A) for every range of every partition (0 for exact cells)."""
        n = anchors.shape[0]
        edges = self.partition.edges(anchors)
        fast = edges is not None and self.transform.identity and self.exact_range is None
        if fast:
            assert edges is not None
            lo, hi = self.support
            f = law.cdf(np.clip(edges, lo if math.isfinite(lo) else -np.inf, hi))
            f[:, 0] = 0.0
            f[:, -1] = 1.0
            cover = np.clip(np.diff(np.maximum.accumulate(f, axis=1), axis=1), 0.0, 1.0)
        else:
            cover = np.stack(
                [self.ranges(anchors, np.full(n, i, np.int64)).mass(law)
                 for i in range(1, self.m + 1)], axis=1)
        for i in self.exact_cells:
            cover[:, i - 1] = 0.0
        return cover

    def coverage_integrand(self, q: FloatArray, law: Law) -> FloatArray:
        """Σ_i P(R_i \\ A)² for the partition drawn from uniforms q (eq. 15)."""
        c = self.cell_coverage(self.partition.anchors(q), law)
        out: FloatArray = np.sum(c * c, axis=1)
        return out

    def describe(self) -> dict[str, Any]:
        out = self.partition.describe()
        out["transform"] = self.transform.name
        if self.exact_cells:
            out["exact_cells"] = list(self.exact_cells)
        if self.exact_range is not None:
            out["exact_range"] = list(self.exact_range)
        return out


@dataclass(frozen=True)
class Selective:
    """Definition 5: collect Z iff L(S_Z) >= τ and W = 1 (W ~ Bern(ρ)); else a null.

    A null discards the anchors. Ignorability (Prop 2) needs ρ <= P(L(S_Z) >= τ).
    ``law`` is the prior under which L is evaluated (the declared prior).

    What is and is not Def 1: a collected range has likelihood ρ·p(anchors)·1{y ∈ S_z}
    (the collect rule reads only the anchors), so its posterior is the prior restricted
    to S_z. A null is not: P(null | y) = 1 − ρ·P(L(S_Z) >= τ | Y = y) varies with y
    (values far out fall in narrow ranges and are dropped more often), so the posterior
    of a null is the prior reweighted by P(null | y)/P(null), not a restricted prior.
    ``coverage.selective_account`` charges for that (see there); never count a null as
    the whole line.
    """

    base: IntervalMechanism
    tau: float
    rho: float
    law: Law

    def __post_init__(self) -> None:
        if self.base.exact_cells or self.base.exact_range is not None:
            raise ValueError("selective collection takes a base mechanism without exact reports")
        if not (0.0 <= self.tau <= 1.0 and 0.0 <= self.rho <= 1.0):
            raise ValueError("tau and rho must be in [0, 1]")

    @property
    def dims(self) -> int:
        return self.base.dims

    @property
    def piece_width(self) -> int:
        return self.base.piece_width

    def release_with_w(self, y: ArrayLike, rng: np.random.Generator) -> tuple[Release, FloatArray]:
        """The release and the (unreleased) W draws, for ignorability checks."""
        full = self.base.release(y, rng)
        w = rng.random(full.n) < self.rho
        collect = w & (full.pieces.mass(self.law) >= self.tau)
        keep = collect.reshape(-1, 1)
        nan_pieces = Pieces(
            np.full_like(full.pieces.left, np.nan), np.full_like(full.pieces.right, np.nan),
            np.zeros_like(full.pieces.left_closed), np.zeros_like(full.pieces.right_closed))
        release = Release(
            np.where(keep, full.anchors, np.nan),
            np.where(collect, full.index, 0),
            full.pieces.where(collect, nan_pieces),
            full.exact,
            collect,
            {k: np.where(collect, v, -1) for k, v in full.extra.items()},
        )
        return release, w.astype(np.float64)

    def release(self, y: ArrayLike, rng: np.random.Generator) -> Release:
        return self.release_with_w(y, rng)[0]

    def coverage_integrand(self, q: FloatArray, law: Law) -> FloatArray:
        """Σ_i c_i [ρ c_i + (1 − ρ)]: the base range released when W = 1, nothing otherwise.

        The selective output is a function of (W, Z) — collect iff W = 1 and
        L(S_Z) >= τ — hence post-processing (Thm 6) of this Def-1 mechanism, whose
        leakage ρ(1 − τ_base) bounds what ranges and nulls reveal together. It is one
        half of the charge: ``expected_coverage`` of a Selective returns
        ``coverage.selective_account(...).charged``, never this alone.
        """
        c = self.base.cell_coverage(self.base.partition.anchors(q), law)
        out: FloatArray = (1.0 - self.rho) + self.rho * np.sum(c * c, axis=1)
        return out

    def collect_integrand(self, q: FloatArray, law: Law) -> FloatArray:
        """P(L(S_Z) >= τ | anchors) = Σ_i c_i·1{c_i >= τ}."""
        c = self.base.cell_coverage(self.base.partition.anchors(q), law)
        out: FloatArray = np.sum(c * (c >= self.tau), axis=1)
        return out

    def account_terms(self, q: FloatArray, law: Law) -> tuple[FloatArray, FloatArray,
                                                               NDArray[np.bool_]]:
        """Per anchor draw (rows of q): the integrands of ``coverage.selective_account``.

        Returns (terms, anchors, kept): terms has the columns ρ Σ_i 1{c_i >= τ} c_i²
        (collected ranges at their Def-1 coverage), Σ_i 1{c_i >= τ} c_i (P(collect |
        anchors)/ρ) and Σ_i c_i² (the base design), c_i the prior mass of range i;
        ``kept`` (N, m) marks the ranges the rule would collect, for ``collect_floor``.
        """
        base = self.base
        anchors = base.partition.anchors(q)
        rule = base.cell_coverage(anchors, self.law)
        c = rule if law is self.law else base.cell_coverage(anchors, law)
        kept = rule >= self.tau
        terms = np.stack([self.rho * np.sum(kept * c * c, axis=1), np.sum(kept * c, axis=1),
                          np.sum(c * c, axis=1)], axis=1)
        return terms, anchors, kept

    def collect_floor(self, anchors: FloatArray, kept: NDArray[np.bool_]) -> float:
        """min over possible values y of the share of these draws that would collect y's range.

        That share is a step function of z = g(y) that moves only where z crosses one
        of a draw's anchors, so one sweep over the sorted anchors inside g(domain)
        visits every value it takes: the minimum is exact for these draws (ties
        between draws can only make it lower). Its expectation lower-bounds
        inf_y P(L(S_Z) >= τ | Y = y).
        """
        base = self.base
        n, k = anchors.shape
        rows = np.arange(n)
        z_lo, z_hi = base.transform.image_support(*base.support)
        start = kept[rows, base.partition.index(np.full(n, z_lo), anchors) - 1]
        positions, steps = [], []
        for j in range(k):
            z = anchors[:, j]
            at = kept[rows, base.partition.index(z, anchors) - 1]
            above = kept[rows, base.partition.index(np.nextafter(z, np.inf), anchors) - 1]
            inside = (z >= z_lo) & (z < z_hi) & (at != above)
            positions.append(z[inside])
            steps.append(above[inside].astype(np.int64) - at[inside].astype(np.int64))
        pos = np.concatenate(positions)
        step = np.concatenate(steps)[np.argsort(pos, kind="stable")]
        level = int(np.count_nonzero(start))
        lowest = min(level, level + int(np.min(np.cumsum(step)))) if step.size else level
        return lowest / n

    def describe(self) -> dict[str, Any]:
        return {"selective": {"tau": self.tau, "rho": self.rho}, **self.base.describe()}


@dataclass(frozen=True)
class Progressive:
    """Example 4: up to ``rounds`` Case-I questions, each anchor uniform on the current range.

    Anchors depend only on earlier released answers (Remark 1). With
    ``tau_stop > 0`` the system stops (Way II) before a round whose drawn
    anchor would leave *either* side with prior mass below ``tau_stop``, and
    discards that round. The decision reads the released range and the fresh
    anchor only, never Y: P(stop | y, history) is the same for every y in the
    released range, so every output — a stopped record and a null included —
    keeps Def 1 (posterior = prior restricted to the final range), and every
    released range has prior mass >= ``tau_stop``. The paper's rule (stop when
    *the side holding Y* would be too narrow) depends on the unreleased answer:
    a stop then says Y sits near an end of its range, which the charge of
    E[L(final range)] does not count (issue #14), so it is not offered.
    """

    support: tuple[float, float]
    rounds: int = 3
    tau_stop: float = 0.0
    law: Law | None = None

    def __post_init__(self) -> None:
        if not all(math.isfinite(b) for b in self.support) or not (
            self.support[0] < self.support[1]
        ):
            raise ValueError("progressive narrowing needs a finite support")
        if self.rounds < 1:
            raise ValueError("at least one round")
        if self.tau_stop > 0 and self.law is None:
            raise ValueError("a stopping floor needs the prior")

    @property
    def dims(self) -> int:
        return self.rounds + 1

    @property
    def piece_width(self) -> int:
        """One interval per record."""
        return 1

    def run(self, y: FloatArray, uniforms: FloatArray) -> Release:
        """Deterministic given the per-round uniforms (n, rounds), drawn without seeing y."""
        n = y.shape[0]
        lo = np.full(n, self.support[0])
        hi = np.full(n, self.support[1])
        lo_closed = np.ones(n, bool)
        active = np.ones(n, bool)
        anchors = np.full((n, self.rounds), np.nan)
        answers = np.full((n, self.rounds), -1, np.int64)
        done = np.zeros(n, np.int64)
        for h in range(self.rounds):
            u = lo + (hi - lo) * uniforms[:, h]
            if self.tau_stop > 0:
                # a function of (released range, fresh anchor): y is not read here
                assert self.law is not None
                narrow = np.minimum(self.law.mass(lo, u, lo_closed, True),
                                    self.law.mass(u, hi, False, True))
                active &= narrow >= self.tau_stop
            le = y <= u
            new_lo = np.where(le, lo, u)
            new_hi = np.where(le, u, hi)
            new_closed = np.where(le, lo_closed, False)
            anchors[:, h] = np.where(active, u, np.nan)
            answers[:, h] = np.where(active, le.astype(np.int64), -1)
            lo = np.where(active, new_lo, lo)
            hi = np.where(active, new_hi, hi)
            lo_closed = np.where(active, new_closed, lo_closed)
            done += active
        pieces = Pieces.single(lo, hi, lo_closed, True)
        extra: dict[str, NDArray[Any]] = {"rounds": done}
        for h in range(self.rounds):
            extra[f"answer_{h + 1}"] = answers[:, h]
        return Release(anchors, done, pieces, np.full(n, np.nan), done > 0, extra)

    def release(self, y: ArrayLike, rng: np.random.Generator) -> Release:
        y = np.asarray(y, dtype=np.float64)
        return self.run(y, rng.random((y.shape[0], self.rounds)))

    def coverage_integrand(self, q: FloatArray, law: Law) -> FloatArray:
        """L(final range) for Y = F⁻¹(q_0) and round uniforms q_1.. (Y is integrated too)."""
        y = law.ppf(q[:, 0])
        r = self.run(y, q[:, 1:])
        return r.coverage(law)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "partition": "progressive", "rounds": self.rounds, "tau_stop": self.tau_stop,
            "support": list(self.support), "anchors": "uniform on the current range"}
        if self.tau_stop > 0:
            out["stop_rule"] = ("stop when either side of the drawn anchor has prior mass below"
                                " tau_stop (decided without the value)")
        return out
