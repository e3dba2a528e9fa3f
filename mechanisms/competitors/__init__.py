"""DIP's competitors (Bi & Shen 2023, spec dip.md §4) as registered mechanisms.

* ``lrm``: Laplace noise on each value (naive multivariate: ε/p per column);
* ``opm.mean``: Duchi, Jordan & Wainwright's clipped-Laplace locally private mean
  (§3.2.1; several columns: ε/p each);
* ``opm.l2ball``: their ℓ2-ball sampler on the whole column as one vector (§4.2.3);
* ``exm``: k exact exponential-mechanism draws of a discrete value (ε/k each).

Bounds and supports come from the metadata only (the paper's data-derived bounds
are not DP), and every sampler is exact or float-safe (see each module).
Importing this package registers the four mechanisms.
"""

from __future__ import annotations

from mechanisms.competitors.exm import ExmMechanism
from mechanisms.competitors.lrm import LrmMechanism
from mechanisms.competitors.opm import OpmL2BallMechanism, OpmMeanMechanism
from mechanisms.registry import register

#: the registered instances (the submodules keep their names: ``competitors.lrm`` etc.)
MECHANISMS = tuple(register(m) for m in (LrmMechanism(), OpmMeanMechanism(),
                                         OpmL2BallMechanism(), ExmMechanism()))

__all__ = ["MECHANISMS", "ExmMechanism", "LrmMechanism", "OpmL2BallMechanism",
           "OpmMeanMechanism"]
