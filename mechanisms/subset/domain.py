"""The categorical domain a design acts on, and the small-domain strategies (§2.7a).

The uniform design needs p ≥ 4. A binary or ternary variable can reach that
by *combining* it with other variables into one joint variable (gender ×
income has 4 categories), or by pairing it with an *artificial* variable U,
uniform on ``artificial_levels`` values and independent of the data. Either
way the marginal of each original variable is post-processing of the joint
distribution: sum over the other factors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.subset import bitmask

#: joint category names are the factors' names joined by this
JOINT_SEPARATOR = "&"


@dataclass(frozen=True)
class Factor:
    """One variable of a joint domain: its name and category names."""

    name: str
    categories: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.categories)


@dataclass(frozen=True)
class Domain:
    """Mixed-radix product of factors (first factor most significant) times U.

    Joint code = ((x_1·p_2 + x_2)·… )·k + u for factors x_i with p_i
    categories and artificial U with k levels (k = 1: none).
    """

    factors: tuple[Factor, ...]
    artificial_levels: int = 1

    def __post_init__(self) -> None:
        if not self.factors or any(f.size < 1 for f in self.factors):
            raise ValueError("a domain needs at least one factor with categories")
        if self.artificial_levels < 1:
            raise ValueError("artificial_levels must be >= 1")
        if self.p > bitmask.MAX_P:
            raise ValueError(f"the joint domain exceeds {bitmask.MAX_P} categories")

    @classmethod
    def single(cls, name: str, categories: Sequence[str]) -> Domain:
        return cls((Factor(name, tuple(categories)),))

    @property
    def radices(self) -> tuple[int, ...]:
        return (*(f.size for f in self.factors), self.artificial_levels)

    @property
    def p(self) -> int:
        return int(np.prod(self.radices))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.factors)

    @property
    def labels(self) -> tuple[str, ...]:
        """Category names of the joint domain, in code order."""
        parts: list[list[str]] = [list(f.categories) for f in self.factors]
        if self.artificial_levels > 1:
            parts.append([f"<u{k + 1}>" for k in range(self.artificial_levels)])
        if len(parts) == 1:
            return tuple(parts[0])
        grids = np.meshgrid(*[np.arange(len(x)) for x in parts], indexing="ij")
        flat = [g.ravel() for g in grids]
        return tuple(
            JOINT_SEPARATOR.join(parts[i][int(c[k])] for i, c in enumerate(flat))
            for k in range(len(flat[0]))
        )

    def encode(self, codes: Sequence[ArrayLike], rng: np.random.Generator | None = None
               ) -> NDArray[np.int64]:
        """Joint codes of per-factor codes; draws U from ``rng`` when artificial."""
        if len(codes) != len(self.factors):
            raise ValueError("give one code array per factor")
        joint: NDArray[np.int64] | None = None
        for factor, values in zip(self.factors, codes, strict=True):
            x = np.asarray(values).astype(np.int64)
            if x.size and (int(x.min()) < 0 or int(x.max()) >= factor.size):
                raise ValueError(f"codes of {factor.name!r} must lie in 0..{factor.size - 1}")
            joint = x if joint is None else joint * factor.size + x
        assert joint is not None
        if self.artificial_levels > 1:
            if rng is None:
                raise ValueError("an artificial variable needs a random generator")
            joint = joint * self.artificial_levels + rng.integers(
                0, self.artificial_levels, size=joint.shape
            )
        return joint

    def marginal_matrix(self, factor: int | str) -> NDArray[np.float64]:
        """The p × p_f 0/1 matrix summing joint categories into one factor's."""
        index = self.names.index(factor) if isinstance(factor, str) else factor
        grids = np.meshgrid(*[np.arange(r) for r in self.radices], indexing="ij")
        codes = grids[index].ravel()
        out = np.zeros((self.p, self.factors[index].size))
        out[np.arange(self.p), codes] = 1.0
        return out

    def marginal(self, w: ArrayLike, factor: int | str) -> NDArray[np.float64]:
        """A factor's distribution from the joint one (post-processing)."""
        result: NDArray[np.float64] = self.marginal_matrix(factor).T @ np.asarray(w, float)
        return result

    def describe(self) -> dict[str, Any]:
        return {
            "factors": [{"column": f.name, "categories": list(f.categories)}
                        for f in self.factors],
            "artificial_levels": self.artificial_levels,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Domain:
        factors = tuple(Factor(f["column"], tuple(f["categories"])) for f in doc["factors"])
        return cls(factors, int(doc.get("artificial_levels", 1)))
