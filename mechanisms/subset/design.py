"""Subset-privacy designs: which subsets may be released, with what probability.

Every valid mechanism is a *conditional design* μ: P(A=a | X=j) = μ_a·1{j∈a}
with Σ_{a∋j} μ_a = 1 and μ_a = 0 for |a| < 2, so A says nothing about X
beyond "X ∈ A" (Definition 1). An *independent design* ν draws Ã without
looking at X and releases Ã or its complement, whichever holds X; it induces
μ_a = ν_a + ν_{a^c}. The uniform design spreads ν evenly over the subsets of
size 2..p−2 and is kept implicit (closed forms, rejection sampling), so it
works up to p = 63; explicit designs are enumerated and capped at p ≤ 16.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import bitmask
from mechanisms.subset.bitmask import Masks

Kind = Literal["uniform", "independent", "conditional"]
#: explicit designs (and every enumeration over 2**p subsets) stop here
ENUMERATION_LIMIT = 16
#: how far a design's sums may be from 1
TOLERANCE = 1e-9
#: smallest eigenvalue of Q that counts as nonsingular (Q is PSD with unit diagonal)
IDENTIFIABILITY_EIGENVALUE = 1e-9

Subsets = ArrayLike | Iterable[Iterable[int]]


class DesignError(ValueError):
    """Not a valid design; ``field`` names the offending part (no data in messages)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def uniform_support_size(p: int) -> int:
    """2**p − 2p − 2: the subsets of size 2..p−2."""
    return (1 << p) - 2 * p - 2


def r_p(p: int) -> Fraction:
    """The uniform design's r_p = (2^{p−1}−p−1)/(2^{p−2}−p+1); q_ij = 1/r_p off the diagonal."""
    if p < 4:
        raise DesignError("p", "the uniform design needs p >= 4")
    return Fraction((1 << (p - 1)) - p - 1, (1 << (p - 2)) - p + 1)


@dataclass(frozen=True, eq=False)
class Design:
    """A validated design on [p]; build it with the constructors below.

    ``masks``/``probs`` hold ν (independent) or μ (conditional) on the
    support, masks increasing; the uniform design leaves them ``None``.
    ``min_size`` is 2 for stand-alone designs and 1 only for the base design
    of the dummy augmentation (Appendix C), where the dummy adds the cover.
    """

    p: int
    kind: Kind
    masks: Masks | None = None
    probs: NDArray[np.float64] | None = None
    min_size: int = 2

    # ------------------------------------------------------------------ structure

    @property
    def is_uniform(self) -> bool:
        return self.kind == "uniform"

    @property
    def is_independent(self) -> bool:
        """Whether the design can run as an independent (survey) mechanism."""
        return self.kind in ("uniform", "independent")

    @property
    def enumerable(self) -> bool:
        """Whether 2**p is small enough to list the support."""
        return self.p <= ENUMERATION_LIMIT

    @functools.cached_property
    def r_p(self) -> Fraction:
        if not self.is_uniform:
            raise DesignError("type", "r_p is defined for the uniform design only")
        return r_p(self.p)

    @functools.cached_property
    def support_size(self) -> int:
        """Number of subsets with μ_a > 0."""
        if self.is_uniform:
            return uniform_support_size(self.p)
        return len(self.law()[0])

    def nu(self) -> tuple[Masks, NDArray[np.float64]]:
        """The independent design ν on its support."""
        if self.is_uniform:
            masks = _sized_masks(self.p, 2, self.p - 2)
            return masks, np.full(len(masks), 1.0 / len(masks))
        if self.kind != "independent":
            raise DesignError("type", "a conditional design has no independent form ν")
        assert self.masks is not None and self.probs is not None
        return self.masks, self.probs

    def law(self) -> tuple[Masks, NDArray[np.float64]]:
        """The conditional design μ on its support (masks increasing)."""
        return self._law

    @functools.cached_property
    def _law(self) -> tuple[Masks, NDArray[np.float64]]:
        if self.kind == "conditional":
            assert self.masks is not None and self.probs is not None
            return self.masks, self.probs
        if not self.enumerable:
            raise DesignError("p", f"listing μ needs p <= {ENUMERATION_LIMIT}")
        masks, nu = self.nu()
        both = np.concatenate([masks, bitmask.complement(masks, self.p)])
        distinct, inverse = np.unique(both, return_inverse=True)
        mu = np.bincount(inverse, weights=np.concatenate([nu, nu]), minlength=len(distinct))
        keep = mu > 0
        return distinct[keep].astype(np.uint64), mu[keep].astype(np.float64)

    def mu_of(self, masks: ArrayLike) -> NDArray[np.float64]:
        """μ_a for arbitrary subsets (0 off the support); cheap for the uniform design."""
        values = bitmask.as_masks(masks)
        if self.is_uniform:
            size = bitmask.popcount(values)
            inside = (size >= 2) & (size <= self.p - 2) & (values <= bitmask.full(self.p))
            return np.where(inside, 2.0 / uniform_support_size(self.p), 0.0)
        support, mu = self.law()
        pos = np.clip(np.searchsorted(support, values), 0, len(support) - 1)
        return np.where(support[pos] == values, mu[pos], 0.0)

    @functools.cached_property
    def Q(self) -> NDArray[np.float64]:
        """Q = Σ_a μ_a 1_a 1_aᵀ: E[1_A] = Q w, so MoM solves Q ŵ = γ̂."""
        if self.is_uniform:
            q = float(1 / self.r_p)
            return (1.0 - q) * np.eye(self.p) + q * np.ones((self.p, self.p))
        masks, mu = self.law()
        rows = bitmask.indicators(masks, self.p)
        q_matrix: NDArray[np.float64] = rows.T @ (mu[:, None] * rows)
        return q_matrix

    def is_identifiable(self) -> bool:
        """Assumption 1 ⇔ Q nonsingular (1 = Σ μ_a 1_a lies in the span of the support)."""
        return bool(np.linalg.eigvalsh(self.Q)[0] > IDENTIFIABILITY_EIGENVALUE)

    def is_complement_symmetric(self) -> bool:
        """μ_a = μ_{a^c}: what an independent mechanism needs, and dummies require."""
        if self.is_uniform:
            return True
        masks, mu = self.law()
        return bool(np.allclose(mu, self.mu_of(bitmask.complement(masks, self.p)), atol=1e-12))

    def to_independent(self) -> Design:
        """ν_a = μ_a/2 for a complement-symmetric conditional design."""
        if self.is_independent:
            return self
        if not self.is_complement_symmetric():
            raise DesignError("type", "only complement-symmetric designs run independently")
        masks, mu = self.law()
        return from_nu(masks, mu / 2.0, self.p, min_size=self.min_size)

    def expected_size(self) -> NDArray[np.float64]:
        """E[|A| | X=j] = (Q 1)_j; constant 1 + (p−1)/r_p for the uniform design."""
        sizes: NDArray[np.float64] = self.Q.sum(axis=1)
        return sizes

    # ------------------------------------------------------------------ JSON

    def describe(self, categories: Sequence[str] | None = None) -> dict[str, Any]:
        """A JSON description that ``from_json`` reads back (names instead of codes if given)."""
        if self.is_uniform:
            r = self.r_p
            size = uniform_support_size(self.p)
            return {
                "type": "uniform",
                "p": self.p,
                "support_size": size,
                "nu": 1.0 / size,
                "subset_sizes": [2, self.p - 2],
                "r_p": float(r),
                "r_p_exact": f"{r.numerator}/{r.denominator}",
            }
        assert self.masks is not None and self.probs is not None

        def name(j: int) -> str | int:
            return categories[j] if categories is not None else j

        doc: dict[str, Any] = {
            "type": "nu" if self.kind == "independent" else "mu",
            "p": self.p,
            "support_size": self.support_size,
            "subsets": [[name(j) for j in bitmask.members(m)] for m in self.masks],
            "probabilities": [float(v) for v in self.probs],
        }
        if self.min_size != 2:
            doc["min_size"] = self.min_size
        return doc


# ---------------------------------------------------------------------- constructors


def uniform(p: int) -> Design:
    """Definition 4: ν_a = 1/(2^p − 2p − 2) for 2 ≤ |a| ≤ p−2 (needs p ≥ 4)."""
    if p < 4:
        raise DesignError(
            "p",
            f"the uniform design needs at least 4 categories (2^p - 2p - 2 = "
            f"{uniform_support_size(p)} subsets of size 2..p-2 for p = {p}); combine the"
            " variable with another, add an artificial variable, or add dummy categories",
        )
    if p > bitmask.MAX_P:
        raise DesignError("p", f"at most {bitmask.MAX_P} categories fit a bitmask")
    return Design(p, "uniform")


def proper(p: int) -> Design:
    """ν uniform over all non-empty proper subsets: the p = 2, 3 base of Appendix C.

    It may release singletons, so it is only valid inside the dummy
    augmentation, where every output also holds one dummy category.
    """
    masks = _sized_masks(p, 1, p - 1)
    return from_nu(masks, np.full(len(masks), 1.0 / len(masks)), p, min_size=1)


def random(p: int, rng: np.random.Generator) -> Design:
    """ν ∝ U(0,1) i.i.d. over the subsets of size 2..p−2 (the paper's simulations, §2.4)."""
    _check_explicit_p(p, 4)
    masks = _sized_masks(p, 2, p - 2)
    weights = rng.random(len(masks))
    return from_nu(masks, weights / weights.sum(), p)


def from_nu(
    subsets: Subsets,
    nu: ArrayLike,
    p: int,
    *,
    min_size: int = 2,
    require_identifiable: bool = True,
) -> Design:
    """An independent design: ν ≥ 0, Σν = 1, support sizes in [min_size, p − min_size]."""
    _check_explicit_p(p, 2 * min_size)
    masks, probs = _support(subsets, nu, p)
    if abs(probs.sum() - 1.0) > TOLERANCE:
        raise DesignError("probabilities", "the probabilities ν must sum to 1")
    sizes = bitmask.popcount(masks)
    if np.any((sizes < min_size) | (sizes > p - min_size)):
        raise DesignError(
            "subsets",
            f"an independent design may only draw subsets of size {min_size}..{p - min_size}"
            " (a subset or its complement is released)",
        )
    keep = probs > 0
    design = Design(p, "independent", masks[keep], probs[keep] / probs[keep].sum(), min_size)
    if require_identifiable:
        _check_identifiable(design)
    return design


def from_mu(
    subsets: Subsets, mu: ArrayLike, p: int, *, require_identifiable: bool = True
) -> Design:
    """A conditional design: μ ≥ 0, |a| ≥ 2 on the support, Σ_{a∋j} μ_a = 1 for every j."""
    _check_explicit_p(p, 3)
    masks, probs = _support(subsets, mu, p)
    if np.any(bitmask.popcount(masks) < 2):
        raise DesignError("subsets", "a released subset must hold at least 2 categories")
    keep = probs > 0
    masks, probs = masks[keep], probs[keep]
    coverage = bitmask.indicators(masks, p).T @ probs
    if np.any(np.abs(coverage - 1.0) > TOLERANCE):
        raise DesignError(
            "probabilities",
            "for every category j the probabilities of the subsets containing j must sum to 1",
        )
    design = Design(p, "conditional", masks, probs)
    if require_identifiable:
        _check_identifiable(design)
    return design


def from_json(doc: Mapping[str, Any], categories: Sequence[str] | None = None) -> Design:
    """Read ``Design.describe`` output back."""
    p = int(doc["p"])
    if doc["type"] == "uniform":
        return uniform(p)
    index = {name: j for j, name in enumerate(categories)} if categories is not None else None
    subsets = [[index[x] if index is not None else int(x) for x in s] for s in doc["subsets"]]
    if doc["type"] == "nu":
        return from_nu(subsets, doc["probabilities"], p, min_size=int(doc.get("min_size", 2)))
    if doc["type"] == "mu":
        return from_mu(subsets, doc["probabilities"], p)
    raise DesignError("type", "unknown design type")


# ---------------------------------------------------------------------- helpers


def _check_explicit_p(p: int, smallest: int) -> None:
    if not smallest <= p <= ENUMERATION_LIMIT:
        raise DesignError(
            "p",
            f"an explicit design needs {smallest} <= p <= {ENUMERATION_LIMIT} categories"
            f" (got {p})",
        )


def _support(subsets: Subsets, probs: ArrayLike, p: int) -> tuple[Masks, NDArray[np.float64]]:
    """Masks and probabilities sorted by mask; shape, range and duplicate checks."""
    if isinstance(subsets, np.ndarray) and subsets.dtype.kind in "iu":
        masks = bitmask.as_masks(subsets)
    else:
        lists = [list(s) for s in subsets]  # type: ignore[arg-type, union-attr]
        if any(len(set(s)) != len(s) for s in lists):
            raise DesignError("subsets", "a subset lists a category twice")
        if any(not 0 <= j < p for s in lists for j in s):
            raise DesignError("subsets", "a subset names a category outside the domain")
        masks = bitmask.from_members(lists)
    values = np.asarray(probs, dtype=np.float64)
    if values.shape != masks.shape or masks.size == 0:
        raise DesignError("probabilities", "give one probability per subset (at least one)")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise DesignError("probabilities", "probabilities must be finite and non-negative")
    if np.any(masks > bitmask.full(p)):
        raise DesignError("subsets", "a subset names a category outside the domain")
    order = np.argsort(masks, kind="stable")
    masks, values = masks[order], values[order]
    if np.any(masks[1:] == masks[:-1]):
        raise DesignError("subsets", "a subset is listed twice")
    return masks, values


def _check_identifiable(design: Design) -> None:
    if not design.is_identifiable():
        raise DesignError(
            "subsets",
            "the design is not identifiable (Q is singular: some combination of categories"
            " always appears together), so the distribution could not be estimated",
        )


@functools.cache
def _sized_masks(p: int, lo: int, hi: int) -> Masks:
    """All masks of [p] with size in [lo, hi] (enumeration; p ≤ ENUMERATION_LIMIT)."""
    if p > ENUMERATION_LIMIT:
        raise DesignError("p", f"listing subsets needs p <= {ENUMERATION_LIMIT}")
    masks = bitmask.all_masks(p)
    sizes = bitmask.popcount(masks)
    out = masks[(sizes >= lo) & (sizes <= hi)]
    out.setflags(write=False)
    return out

