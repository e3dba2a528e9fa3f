"""A 2*10^6-row CSV through gunicorn and the worker with bounded memory (CI-sized).

The same path as ``make large`` (``tests/large/large_data.py``) at a fifth of
the rows: the API process must not grow by more than pyarrow's read-ahead
and one parse chunk while the file is uploaded, and the worker must not copy
the stored columns for a mean. Reading the upload whole, building the columns in memory, or loading
them without ``mmap_mode`` each exceeds a bound here.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.harness import Service
from tests.large.large_data import (
    BYTES_PER_ROW,
    MB,
    METADATA,
    Sampler,
    api_bound,
    release,
    upload,
    warm_up,
    worker_bound,
    write_csv,
)

N_ROWS = 2_000_000


def test_large_upload_and_release_stay_within_memory_bounds(
    service: Service, tmp_path: Path
) -> None:
    path = tmp_path / "large.csv"
    size = write_csv(path, N_ROWS, seed=1)
    assert size > 50 * MB  # a non-streamed upload would hold this much at least
    assert service.proc is not None
    warm_up(service)
    sampler = Sampler(service.proc.pid)

    with sampler.phase() as peaks:
        resp = upload(service.url, path, METADATA, timeout=240)
    assert resp.status_code == 201, resp.text[:2000]
    doc = resp.json()
    assert doc["n_rows"] == N_ROWS
    api = peaks["api"]
    # less than the file or the columns: neither was ever whole in memory
    assert api.growth < api_bound(N_ROWS) < min(size, N_ROWS * BYTES_PER_ROW), str(api)

    with sampler.phase() as peaks:
        out = release(service, {"dataset_id": doc["id"], "mechanism": "laplace",
                                "params": {"statistic": "mean", "column": "x"},
                                "budget": {"epsilon": 1}}, timeout=120)
    assert out["status"] == "succeeded", out
    # x ~ U(0, 100): sd 28.9 / sqrt(2e6) = 0.02, the Laplace noise 100 / 2e6 is smaller
    assert abs(out["result"]["value"] - 50.0) < 0.2
    assert peaks["worker"].anon_growth < worker_bound(N_ROWS), str(peaks["worker"])
