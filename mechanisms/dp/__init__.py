"""Exact differential privacy: the ``laplace``, ``geometric`` and ``gaussian`` baselines.

One family, like ``interval`` or ``iclp``: counts, sums, means and histograms
(``baselines``), cross-tabs (``tables``), quantiles (``quantiles``), variance, std and
covariance (``moments``) and the vector noise they share (``vectors``), all on the
declared bounds with float-safe integer noise. Notebook use::

    from mechanisms.dp import baselines
    params = baselines.laplace.load_params({"statistic": "mean", "column": "age"})

``baselines`` validates every statistic's params and charges its budget, and hands
the extended statistics to ``tables``, ``quantiles`` and ``moments`` (which import it
at the top; it imports them late, when it dispatches). Importing this package
registers ``laplace``, ``geometric`` and ``gaussian``.
"""

from __future__ import annotations

# baselines registers the three mechanisms; the others import it
from mechanisms.dp import baselines, moments, quantiles, tables, vectors

__all__ = ["baselines", "moments", "quantiles", "tables", "vectors"]
