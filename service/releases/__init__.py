"""The release pipeline, one module per step: ``request`` (the stored request),
``pricing`` (checks and cost), ``submit`` (reserve and enqueue), ``run`` (the worker's
run), ``documents`` (what readers see), ``queue`` (job names), ``sweeper`` (recovery),
``cold`` (heavy precomputations never computed in an API thread)."""
