"""The baseline for API throughput: a bare Flask JSON endpoint doing what a release's POST
cannot do without, and nothing else: one database transaction (a row holding the request,
through a pool from ``database.connect`` as the service's) and one broker publish (a
Celery ``send_task`` through ``queue.make_celery``'s app, to the same Valkey), under the
same gunicorn settings. No authentication, validation, pricing or ledger.

The database and the broker are the service's (``PRIVRELEASE_DATABASE_URL``,
``PRIVRELEASE_REDIS_URL``); the table ``bare_releases`` is made by the benchmark, and the
messages go to a queue no worker serves (``BARE_QUEUE``), which the benchmark deletes.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from flask import Flask, request

from service.config import Config
from service.releases.queue import make_celery
from service.storage import database
from tests.bench.stack import BARE_QUEUE, BARE_TASK

config = Config.from_env()
app = Flask("bare")
# gunicorn imports the app in each worker after the fork: a pool and a Celery app per process
pool = database.connect(config.database_url) if config.database_url else None
celery = make_celery(config)


@app.post("/v1/releases")
def releases() -> tuple[dict[str, Any], int]:
    body = request.get_json()
    release_id = "rel_" + secrets.token_hex(12)
    if pool is not None:
        with pool.connection() as conn:  # one transaction: committed on leaving
            conn.execute("INSERT INTO bare_releases (id, body) VALUES (%s, %s)",
                         (release_id, json.dumps(body)))
    celery.send_task(BARE_TASK, args=[release_id], task_id=release_id, queue=BARE_QUEUE)
    return {"id": release_id, "status": "queued", "dataset_id": body["dataset_id"]}, 202
