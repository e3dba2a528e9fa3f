"""The release pipeline, one module per step: ``request`` (the stored request),
``pricing`` (every check and the cost; heavy parts never computed cold in the API),
``submit`` (reserve and enqueue, for the POST and the pricing job), ``queue`` (job names
and the broker), ``run`` (the worker's run, without Celery), ``documents`` (what readers
see) and ``sweeper`` (recovery of lost jobs)."""
