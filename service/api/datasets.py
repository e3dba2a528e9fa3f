"""Datasets: upload (CSV + public metadata), metadata reads, budget view."""

from __future__ import annotations

import json
from typing import Any

from flask import current_app
from flask_smorest import Blueprint

from service import budget, datasets
from service.auth import check_dataset_grant, current_key, require
from service.ingest import IngestError, parse_csv, parse_metadata
from service.problems import APIError
from service.schemas import BudgetSchema, DatasetFileSchema, DatasetSchema, DatasetUploadSchema

blp = Blueprint("datasets", __name__, url_prefix="/v1/datasets", description="Datasets")


def _invalid(field: str, message: str) -> APIError:
    return APIError(422, message, code="validation_error", field=field)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads would keep the last of two equal keys; a duplicate column is an error."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def dataset_or_404(dataset_id: str) -> dict[str, Any]:
    doc = datasets.get(current_app.extensions["redis"], dataset_id)
    if doc is None:
        raise APIError(404, "no such dataset", code="not_found")
    check_dataset_grant(dataset_id)
    return doc


@blp.route("", methods=["POST"])
@require("operator")
@blp.arguments(DatasetUploadSchema, location="form", as_kwargs=True)
@blp.arguments(DatasetFileSchema, location="files", as_kwargs=True)
@blp.response(201, DatasetSchema)
def upload(metadata: str, file: Any) -> dict[str, Any]:
    """Register a dataset: CSV with a header row + metadata JSON. Nothing is kept on error."""
    config = current_app.config["PRIVRELEASE"]
    try:
        raw_meta = json.loads(metadata, object_pairs_hook=_unique_keys)
    except _DuplicateKey as dup:
        raise _invalid("metadata", f"duplicate key {dup.args[0]!r} in metadata") from None
    except ValueError:
        raise _invalid("metadata", "metadata is not valid JSON") from None
    try:
        spec = parse_metadata(raw_meta)
        categorical = [n for n, c in spec.columns.items() if c.type == "categorical"]
        caps = budget.parse_caps(spec.budgets, list(spec.columns), categorical)
        n_rows, columns = parse_csv(file.read(), spec, max_rows=config.max_rows)
    except (IngestError, budget.AmountError) as err:
        raise _invalid(err.field, err.message) from None
    return datasets.register(
        current_app.extensions["redis"], current_app.extensions["store"],
        current_app.extensions["ledger"], spec, caps, n_rows, columns, current_key().id,
    )


@blp.route("")
@require("consumer")
@blp.response(200, DatasetSchema(many=True))
def list_datasets() -> list[dict[str, Any]]:
    """Metadata of every dataset this key may see (never values)."""
    key = current_key()
    docs = datasets.list_all(current_app.extensions["redis"])
    return [d for d in docs if key.datasets is None or d["id"] in key.datasets]


@blp.route("/<dataset_id>")
@require("consumer")
@blp.response(200, DatasetSchema)
def show(dataset_id: str) -> dict[str, Any]:
    """One dataset's public metadata."""
    return dataset_or_404(dataset_id)


@blp.route("/<dataset_id>/budget")
@require("analyst")
@blp.response(200, BudgetSchema)
def show_budget(dataset_id: str) -> dict[str, Any]:
    """Cap, committed, reserved and remaining for each measure."""
    dataset_or_404(dataset_id)
    rows = current_app.extensions["ledger"].balance(dataset_id)
    return {
        "dataset_id": dataset_id,
        "measures": {m: {k: budget.display(m, v) for k, v in row.items()}
                     for m, row in sorted(rows.items())},
    }
