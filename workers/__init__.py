"""The Celery edge: the worker app (``celery_app``), its named tasks (``tasks``) and its
command (``python -m workers``). Everything a task does is in ``service``."""
