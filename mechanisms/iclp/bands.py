"""Pointwise 95 % bands of a released function (a density or a mean function): at each
grid point, a multiple of the noise's sd there, computed from the public noise law.

A single band of 1.96 x the RMS error over the domain covers well on average but not
where the noise is concentrated (a density's or a Bernstein mean's ends covered 70-80 %):
each point's own sd is what a pointwise statement needs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

#: the Laplace's 95 % point in standard deviations, ln(20)/√2: exact for one Laplace (where
#: 1.96 sd covers only 93.7 %); weighted sums of independent Laplace noises are lighter-
#: tailed (95.0-96.1 % for up to six terms, equal or decaying weights, checked numerically;
#: pointwise coverage of the densities is simulated in tests/unit/iclp/test_stated_accuracy)
LAPLACE_Z95 = math.log(20.0) / math.sqrt(2.0)


def pointwise_band(basis: ArrayLike, variances: ArrayLike, span: float) -> dict[str, Any]:
    """The density's pointwise 95 % band from the noise covariance on the grid (public).

    The released raw density is (basis @ c̃)/span with independent noises of ``variances``
    on c̃, so its noise sd at grid point k is √(Σ_j basis_kj² Var_j)/span; the band is
    ``LAPLACE_Z95`` times it at each point, ``band95`` its largest half-width (the one a
    single ± band drawn around the whole curve uses).
    """
    b = np.asarray(basis, dtype=np.float64)
    sd = np.sqrt((b * b) @ np.asarray(variances, dtype=np.float64)) / span
    half = LAPLACE_Z95 * sd
    return {
        "band95": float(half.max()),
        "band95_pointwise": half,
        "pointwise_sd": sd,
        "band_level": {"level": 0.95, "kind": "pointwise", "simultaneous": False,
                       "z": LAPLACE_Z95},
    }


def band_sentence(band: dict[str, Any], target: str = "the smoothed KDE",
                  what: str = "density") -> str:
    """The pointwise band in words (one sentence for every density release, and for a
    mean function's with ``what="mean"``)."""
    after = (", before the optional clipping and renormalisation" if what == "density"
             else "")
    return (
        f" Pointwise on the {what}'s scale: at each grid point the released {what} is"
        f" within +/- band95_pointwise of {target} with probability >= 95 % (largest"
        f" half-width band95 = {band['band95']:.6g}, in {what} units: {LAPLACE_Z95:.4f} x the"
        f" noise's sd at that point, the Laplace's 95 % point){after}; per point, not"
        " simultaneous over the grid."
    )
