"""What a functional release holds, and its JSON form (DESIGN §4: ``values`` + ``grid``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, eq=False)
class FunctionRelease:
    """A released function: grid values, the noisy coefficients it was built from, tuning.

    ``values`` are post-processing of ``coefficients`` (each an exact lattice
    point), so releasing both costs nothing extra.
    """

    grid: NDArray[np.float64]
    values: NDArray[np.float64]
    coefficients: NDArray[np.float64]
    kernel: Mapping[str, Any]
    smoothing: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_result(self) -> dict[str, Any]:
        """Plain JSON types only (floats, lists, dicts, strings)."""
        return {
            "values": _floats(self.values),
            "grid": _floats(self.grid),
            "coefficients": _floats(self.coefficients),
            "kernel": jsonable(self.kernel),
            "smoothing": jsonable(self.smoothing),
            **{k: jsonable(v) for k, v in self.extra.items()},
        }


def _floats(a: NDArray[np.float64]) -> list[float]:
    return [float(x) for x in np.asarray(a, dtype=np.float64).ravel()]


def jsonable(value: Any) -> Any:
    """numpy scalars/arrays to Python; non-finite floats to None (JSON has no inf)."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [jsonable(v) for v in value]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    return value
