"""Celery app and tasks: run releases on workers."""
