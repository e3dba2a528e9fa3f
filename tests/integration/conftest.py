"""Fixtures for API tests: the Flask app in-process, a real worker beside it."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from flask import Flask
from flask.testing import FlaskClient
from numpy.typing import NDArray

from service import wiring
from service.config import Config
from service.storage.analysis_store import AnalysisStore
from service.storage.keys import KeyStore

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession

#: the local Spark the Spark tests share (``spark``)
SPARK_REMOTE = "local[2]"

TOKEN = "pr_test_operator_token"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark Connect server for every Spark test of the session (its workers run
    this Python), started by the first that asks: a local Spark stopped and started again
    in one process fails its next job, so modules cannot each have their own."""
    from service.engines.spark_session import spark_session, stop

    session = spark_session(SPARK_REMOTE)
    yield session
    stop(SPARK_REMOTE)


@pytest.fixture(scope="session")
def app(service_env: dict[str, str]) -> Iterator[Flask]:
    saved = dict(os.environ)
    os.environ.update(service_env)
    try:
        from service import apikeys
        from service.api.app import create_app

        flask_app = create_app(Config.from_env())
        apikeys.create(wiring.of(flask_app).keys, "operator", "tests", token=TOKEN)
        yield flask_app
    finally:
        os.environ.clear()
        os.environ.update(saved)


class Api:
    """A tiny authenticated wrapper over Flask's test client."""

    def __init__(self, client: FlaskClient, token: str = TOKEN) -> None:
        self.client, self.token = client, token

    def _h(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **(extra or {})}

    def get(self, path: str) -> Any:
        return self.client.get(path, headers=self._h())

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        return self.client.post(path, json=body, headers=self._h(headers))

    def upload(self, csv: str, metadata: dict[str, Any] | str) -> Any:
        meta = metadata if isinstance(metadata, str) else json.dumps(metadata)
        data = {"metadata": meta, "file": (io.BytesIO(csv.encode()), "data.csv")}
        return self.client.post("/v1/datasets", data=data, headers=self._h(),
                                content_type="multipart/form-data")

    def released_rows(self, dataset_id: str, n: int) -> NDArray[np.intp]:
        """The dataset rows in the order its microdata releases list them: position j is
        row ``order[j]`` (the test reads the private key the worker uses)."""
        from mechanisms import rows
        from service import datasets

        store = wiring.of(self.client.application).datasets
        return rows.order(datasets.row_key(store, dataset_id, 1), n)

    def wait(self, release_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The release once it ended (succeeded, failed, refused after pricing, cancelled)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc: dict[str, Any] = self.get(f"/v1/releases/{release_id}").get_json()
            if doc["status"] in {"succeeded", "failed", "refused", "cancelled"}:
                return doc
            time.sleep(0.05)
        raise TimeoutError(release_id)

    def estimate(self, body: dict[str, Any], timeout: float = 60.0) -> Any:
        """POST an estimate, retried while it is 202 pricing (a worker computes the cold
        precomputation); the first other answer."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            resp = self.post("/v1/releases/estimate", body)
            if resp.status_code != 202:
                return resp
            time.sleep(0.1)
        raise TimeoutError("estimate stayed pricing")


@pytest.fixture()
def api(app: Flask) -> Api:
    return Api(app.test_client())


@pytest.fixture()
def keys(app: Flask) -> KeyStore:
    """The session service's key store: where its API reads keys and console sessions
    (PostgreSQL)."""
    return wiring.of(app).keys


@pytest.fixture()
def analysis_store(app: Flask) -> AnalysisStore:
    """The session service's analyses (PostgreSQL)."""
    return wiring.of(app).analyses


#: the request a ledger-only test's reservation records: a whole one, as the API writes
#: it, so the session's release lists (which render every release) can show the release
LEDGER_REQUEST = json.dumps({
    "dataset_id": "ds_0000000000000001", "dataset_version": 1, "mechanism": "laplace",
    "params": {"statistic": "mean", "column": "age"}, "cost": {"epsilon": "1/2"},
    "cost_units": {"epsilon": 500000000}, "accuracy": {"ci95_halfwidth": 3.0},
    "seed": None, "callback_url": None, "privacy": {"notions": ["dp"]}})
#: and the output its commit stores (a whole one, for the same reason)
LEDGER_OUTPUT = json.dumps({"result": {"value": 0.0}, "accuracy": {"ci95_halfwidth": 3.0},
                            "guarantee": "pure epsilon-DP"})

PEOPLE_META: dict[str, Any] = {
    "name": "people",
    "columns": {
        "age": {"type": "integer", "bounds": [0, 100]},
        "income": {"type": "continuous", "bounds": [0, 1000]},
        "group": {"type": "categorical", "categories": ["a", "b", "c"]},
    },
    # the operator's explicit opt-in to what this metadata once got by default (#27.3): a
    # subset draw of the categorical column, every notion, record-level releases
    "budgets": {"epsilon": 5, "delta": 1e-5, "subset_draws:group": 1},
    "notions": ["dp", "noiseless", "interval", "subset"],
    "record_level": True,
}


def people_csv(n: int = 200) -> str:
    rows = ["age,income,group"]
    for i in range(n):
        rows.append(f"{20 + i % 50},{(i * 37) % 1000}.5,{'abc'[i % 3]}")
    return "\n".join(rows) + "\n"


@pytest.fixture()
def dataset(api: Api) -> dict[str, Any]:
    resp = api.upload(people_csv(), PEOPLE_META)
    assert resp.status_code == 201, resp.get_json()
    doc: dict[str, Any] = resp.get_json()
    return doc
