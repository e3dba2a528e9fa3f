"""The baseline for API throughput: a bare Flask JSON endpoint, same gunicorn config."""

from __future__ import annotations

from typing import Any

from flask import Flask, request

app = Flask("bare")


@app.post("/v1/releases")
def releases() -> tuple[dict[str, Any], int]:
    body = request.get_json()
    return {"id": "rel_bare", "status": "queued", "echo": body["dataset_id"]}, 202
