"""End to end: the `privrelease` client subcommands against a live `privrelease standalone`.

The CLI runs as a subprocess through its real entry point (``python -m service.processes.cli``),
configured by PRIVRELEASE_URL/PRIVRELEASE_KEY like a user's shell.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from privrelease_client import ApiError, Client

from tests.conftest import ROOT
from tests.e2e.harness import TOKEN, Service
from tests.unit.test_client_cli_alone import client_alone

META = {"name": "cli-people", "budgets": {"epsilon": 2, "delta": 1e-6},
        "columns": {"x": {"type": "continuous", "bounds": [0, 1]},
                    "g": {"type": "categorical", "categories": ["u", "v"]}}}
CSV = "x,g\n" + "".join(f"{(i % 10) / 10},{'uv'[i % 2]}\n" for i in range(100))
MEAN_X = '{"statistic": "mean", "column": "x"}'
COUNT_X = '{"statistic": "count", "condition": {"column": "x", "op": "ge", "value": 0.5}}'




def env_for(service: Service, key: str | None = TOKEN) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVRELEASE_")}
    env["PRIVRELEASE_URL"] = service.url
    if key is not None:
        env["PRIVRELEASE_KEY"] = key
    return env


def cli(service: Service, *args: str, key: str | None = TOKEN,
        ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `privrelease ARGS`; by default assert it succeeded. Never shows the operator key."""
    proc = subprocess.run([sys.executable, "-m", "service.processes.cli", *args], cwd=ROOT,
                          env=env_for(service, key), capture_output=True, text=True, timeout=60)
    assert TOKEN not in proc.stdout + proc.stderr
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def cli_json(service: Service, *args: str) -> Any:
    return json.loads(cli(service, *args, "--json").stdout)


def field(text: str, name: str) -> str:
    """A ``name: value`` line of human output."""
    match = re.search(rf"^{re.escape(name)}:\s+(.*)$", text, re.MULTILINE)
    assert match, text
    return match.group(1).strip()


@pytest.fixture()
def files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "people.csv").write_text(CSV)
    (tmp_path / "meta.json").write_text(json.dumps(META))
    return tmp_path / "people.csv", tmp_path / "meta.json"


@pytest.fixture()
def dataset(service: Service) -> str:
    return service.upload({"epsilon": 2, "delta": 1e-6})


def test_datasets_upload_list_show(service: Service, files: tuple[Path, Path]) -> None:
    csv, meta = files
    out = cli(service, "datasets", "upload", str(csv), "--metadata", str(meta)).stdout
    ds = field(out, "id")
    assert field(out, "rows") == "100" and field(out, "status") == "active"
    assert re.search(r"^x\s+continuous\s+\[0, 1\]$", out, re.MULTILINE), out

    listed = cli_json(service, "datasets", "list")
    assert [d["n_rows"] for d in listed if d["id"] == ds] == [100]
    assert ds in cli(service, "datasets", "list").stdout

    doc = cli_json(service, "datasets", "upload", str(csv), "--metadata-json",
                   json.dumps({**META, "name": "cli-inline"}))
    assert doc["name"] == "cli-inline" and doc["id"] != ds
    shown = cli(service, "datasets", "show", ds).stdout
    assert field(shown, "name") == "cli-people"
    assert re.search(r"^g\s+categorical\s+u, v$", shown, re.MULTILINE), shown


def test_release_create_wait_then_show(service: Service, dataset: str) -> None:
    proc = cli(service, "release", "create", "--dataset", dataset, "--mechanism", "laplace",
               "--params", MEAN_X, "--budget", "epsilon=0.5", "--wait", "--timeout", "30")
    assert proc.stderr == ""  # no progress output when stderr is not a terminal
    rid = field(proc.stdout, "id")
    assert field(proc.stdout, "status") == "succeeded"
    assert field(proc.stdout, "cost") == "epsilon=0.5"
    value = float(field(proc.stdout, "result.value"))

    doc = cli_json(service, "release", "show", rid)
    assert doc["status"] == "succeeded" and doc["result"]["value"] == value
    assert doc["cost"] == {"epsilon": 0.5} and doc["dataset_id"] == dataset
    assert field(cli(service, "release", "show", rid).stdout, "status") == "succeeded"
    listed = cli(service, "release", "list", "--dataset", dataset).stdout
    assert re.search(rf"^{rid}\s+{dataset}\s+laplace\s+succeeded\s+epsilon=0.5", listed,
                     re.MULTILINE), listed


def test_release_without_wait_and_replay(service: Service, dataset: str) -> None:
    args = ("release", "create", "--dataset", dataset, "--mechanism", "geometric",
            "--params", COUNT_X, "--budget", "epsilon=0.25")
    first = cli_json(service, *args)
    assert first["status"] in {"queued", "running", "succeeded"}
    service.wait(first["id"])
    again = cli_json(service, *args)  # an identical request spends nothing
    assert again["id"] == first["id"] and again["replayed"] is True


def test_wait_shows_progress_on_a_terminal(service: Service, dataset: str) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "service.processes.cli", "release", "create", "--dataset",
             dataset, "--mechanism", "laplace", "--params", MEAN_X, "--budget", "epsilon=0.1",
             "--wait"], cwd=ROOT, env=env_for(service), stdout=subprocess.PIPE,
            stderr=slave, text=True, timeout=60)
        os.close(slave)
        tty = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            tty += chunk
    finally:
        os.close(master)
    assert proc.returncode == 0
    rid = field(proc.stdout, "id")
    text = tty.decode()
    assert re.search(rf"\r[|/\\-] {rid} (queued|running|succeeded)\s+\d+\.\d+s", text), text
    assert text.endswith("\r\x1b[K")  # the line is cleared before the result is printed


def test_budget_show_and_set(service: Service, dataset: str) -> None:
    rid = service.call("POST", "/v1/releases", json={
        "dataset_id": dataset, "mechanism": "laplace", "params": json.loads(MEAN_X),
        "budget": {"epsilon": 0.5}}).json()["id"]
    service.wait(rid)
    out = cli(service, "budget", "show", dataset).stdout
    assert re.search(r"^MEASURE\s+CAP\s+COMMITTED\s+RESERVED\s+REMAINING$", out, re.MULTILINE)
    assert re.search(r"^epsilon\s+2\s+0\.5\s+0\s+1\.5$", out, re.MULTILINE), out
    assert re.search(r"^delta\s+1e-06\s+0\s+0\s+1e-06$", out, re.MULTILINE), out

    analyst = cli_json(service, "keys", "create", "--role", "analyst", "--dataset", dataset)
    doc = cli_json(service, "budget", "set", dataset, "--cap", "epsilon=3",
                   "--allocation", f"{analyst['id']}:epsilon=1")
    assert doc["measures"]["epsilon"]["cap"] == 3
    assert doc["allocations"][analyst["id"]]["epsilon"]["cap"] == 1
    assert re.search(rf"^{analyst['id']}\s+epsilon\s+1\s", cli(
        service, "budget", "show", dataset).stdout, re.MULTILINE)

    low = cli(service, "budget", "set", dataset, "--cap", "epsilon=0.1", ok=False)
    assert low.returncode == 1 and low.stderr.startswith("error: cap_below_spent: ")
    assert cli_json(service, "budget", "show", dataset)["measures"]["epsilon"]["cap"] == 3


def test_keys_create_list_revoke(service: Service, dataset: str) -> None:
    created = cli_json(service, "keys", "create", "--role", "analyst", "--label", "cli-test",
                       "--dataset", dataset)
    token, key_id = created["token"], created["id"]
    assert created["role"] == "analyst" and created["datasets"] == [dataset]
    human = cli(service, "keys", "create", "--role", "consumer", "--label", "cli-human",
                "--expires", "2999-01-01T00:00:00Z").stdout
    other = field(human, "token")
    assert other.startswith("pr_") and human.count(other) == 1
    assert field(human, "expires").startswith("2999-01-01")

    listing = cli(service, "keys", "list").stdout
    assert re.search(rf"^{key_id}\s+analyst\s+cli-test\s+{dataset}\s+never\s", listing,
                     re.MULTILINE), listing
    assert token not in listing and other not in listing
    as_json = cli(service, "keys", "list", "--json").stdout
    assert key_id in as_json and token not in as_json and other not in as_json

    with Client(service.url, token, retries=0) as analyst:
        assert [d["id"] for d in analyst.list_datasets()] == [dataset]
        assert cli(service, "keys", "revoke", key_id).stdout.strip() == f"revoked {key_id}"
        # refused by every API process within PRIVRELEASE_KEY_CACHE_SECONDS (1 s): the one
        # that answered the list may keep the key that long
        deadline = time.monotonic() + 3
        with pytest.raises(ApiError) as info:
            while True:
                analyst.list_datasets()
                assert time.monotonic() < deadline, "the revoked key is still accepted"
                time.sleep(0.1)
    assert info.value.status == 401 and info.value.code == "unauthorized"
    assert key_id not in cli(service, "keys", "list").stdout


def test_jobs_list_and_cancel(service: Service, dataset: str) -> None:
    rid = cli_json(service, "release", "create", "--dataset", dataset, "--mechanism",
                   "laplace", "--params", MEAN_X, "--budget", "epsilon=0.3")["id"]
    jobs = cli_json(service, "jobs", "list")
    assert isinstance(jobs, list)
    assert all({"id", "dataset_id", "mechanism", "status", "age_seconds"} <= set(j)
               for j in jobs)
    out = cli(service, "jobs", "list").stdout
    assert out.startswith("ID") or out.strip() == "no jobs"
    service.wait(rid)
    finished = cli(service, "jobs", "cancel", rid, ok=False)  # too late: it already ran
    assert finished.returncode == 1 and finished.stderr.startswith("error: job_")
    missing = cli(service, "jobs", "cancel", "rel_nope", ok=False)
    assert missing.returncode == 1 and missing.stderr.startswith("error: not_found: ")


def test_errors_and_usage(service: Service, dataset: str) -> None:
    no_key = cli(service, "datasets", "list", key=None, ok=False)
    assert no_key.returncode == 2 and "PRIVRELEASE_KEY" in no_key.stderr
    assert no_key.stdout == ""
    wrong = cli(service, "datasets", "list", key="pr_wrong_key_0000000000", ok=False)
    assert wrong.returncode == 1 and wrong.stderr.startswith("error: unauthorized: ")
    assert "pr_wrong_key" not in wrong.stderr
    flag = cli(service, "datasets", "list", "--key", "pr_wrong_key_0000000000",
               key=TOKEN, ok=False)  # the flag wins over the environment
    assert flag.returncode == 1 and "unauthorized" in flag.stderr

    bad = cli(service, "release", "create", "--dataset", dataset, "--mechanism", "laplace",
              "--params", '{"statistic": "mean", "column": "nope"}', "--budget",
              "epsilon=0.5", ok=False)
    assert bad.returncode == 1 and bad.stdout == ""
    assert re.fullmatch(r"error: validation_error: .+ \(field: params\.column\)\n", bad.stderr)
    usage = cli(service, "release", "create", "--dataset", dataset, "--mechanism", "laplace",
                "--budget", "epsilon=lots", ok=False)
    assert usage.returncode == 2 and "expected MEASURE=NUMBER" in usage.stderr
    missing = cli(service, "datasets", "show", "ds_nope", ok=False)
    assert missing.returncode == 1 and missing.stderr.startswith("error: not_found: ")


# -- the commands issue #18 added: estimate, catalog, analyses, plot, ledger, retire -----


def test_estimate_and_the_mechanism_catalog(service: Service, dataset: str) -> None:
    args = ("--dataset", dataset, "--mechanism", "laplace", "--params", MEAN_X,
            "--budget", "epsilon=0.5")
    out = cli(service, "estimate", *args).stdout
    assert field(out, "cost") == "epsilon=0.5" and field(out, "remaining") == "epsilon=2"
    doc = cli_json(service, "release", "estimate", *args)
    assert doc["cost"] == {"epsilon": 0.5} and doc["remaining"] == {"epsilon": 2}
    assert cli_json(service, "budget", "show", dataset)["measures"]["epsilon"][
        "reserved"] == 0  # an estimate spends nothing

    listing = cli(service, "mechanisms").stdout
    assert re.search(r"^laplace\s+epsilon\s+-?\s", listing, re.MULTILINE), listing
    assert re.search(r"^interval\.case1\s+interval_leakage\s+.*npmle", listing,
                     re.MULTILINE), listing
    names = [m["name"] for m in cli_json(service, "mechanisms")]
    assert "laplace" in names and "subset.uniform" in names
    one = cli(service, "mechanisms", "laplace").stdout
    assert field(one, "name") == "laplace"
    assert re.search(r"^statistic\s+\S+\s+yes\b", one, re.MULTILINE), one
    unknown = cli(service, "mechanisms", "nope", ok=False)
    assert unknown.returncode == 2 and "no mechanism 'nope'" in unknown.stderr


def test_budget_exhausted_prints_requested_and_remaining(service: Service,
                                                         dataset: str) -> None:
    """Catches a refusal that says only "not enough": the amounts the server sent
    (requested, remaining, whose budget) must reach the user."""
    proc = cli(service, "release", "create", "--dataset", dataset, "--mechanism", "laplace",
               "--params", MEAN_X, "--budget", "epsilon=5", ok=False)
    assert proc.returncode == 1 and proc.stdout == ""
    first, second = proc.stderr.splitlines()
    assert first.startswith("error: budget_exhausted: ")
    assert second == "  requested: 5 epsilon, remaining: 2 epsilon (dataset budget)"


def test_ledger_export_audit_alias_and_retire(service: Service, dataset: str,
                                              tmp_path: Path) -> None:
    rid = cli_json(service, "release", "create", "--dataset", dataset, "--mechanism",
                   "laplace", "--params", MEAN_X, "--budget", "epsilon=0.5", "--wait")["id"]
    out = tmp_path / "audit.jsonl"
    said = cli(service, "ledger", dataset, "-o", str(out)).stdout.strip()
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert said == f"{len(events)} events -> {out}"
    with Client(service.url, TOKEN) as c:
        assert events == c.ledger(dataset)  # the same events as the JSON route
    assert {"cap", "reserve", "commit"} <= {e["kind"] for e in events}
    assert any(e.get("release_id") == rid for e in events)
    commits = cli(service, "audit", dataset, "--kind", "commit").stdout.splitlines()
    assert [json.loads(line)["kind"] for line in commits] == ["commit"]

    retired = cli_json(service, "datasets", "retire", dataset)
    assert retired["id"] == dataset and retired["status"] == "retired"
    refused = cli(service, "release", "create", "--dataset", dataset, "--mechanism",
                  "laplace", "--params", MEAN_X, "--budget", "epsilon=0.1", ok=False)
    assert refused.returncode == 1 and refused.stderr.startswith("error: dataset_retired")


def test_dataset_versions_on_one_budget(service: Service, dataset: str,
                                        tmp_path: Path) -> None:
    """Catches a CLI version upload that becomes current by itself or gets its own
    budget, a release flag that does not reach the server, and retirement of the
    current version."""
    csv = tmp_path / "v2.csv"
    csv.write_text("x,g\n" + "".join(f"0.9,{'uv'[i % 2]}\n" for i in range(40)))
    made = cli_json(service, "datasets", "versions", "upload", dataset, str(csv))
    assert (made["version"], made["n_rows"], made["current"]) == (2, 40, False)
    listed = cli(service, "datasets", "versions", "list", dataset).stdout
    assert re.search(r"^1\s+\*\s+active\s+100\b", listed, re.MULTILINE), listed
    assert cli_json(service, "datasets", "versions", "current", dataset, "2")["current"]
    # the mean of x on v2 (every x is 0.9), with the dataset's budget of 2 - 1.5 spent
    rel = cli_json(service, "release", "create", "--dataset", dataset, "--mechanism",
                   "laplace", "--params", MEAN_X, "--budget", "epsilon=1.5", "--wait")
    assert rel["dataset_version"] == 2
    old = cli_json(service, "release", "create", "--dataset", dataset, "--mechanism",
                   "laplace", "--params", MEAN_X, "--budget", "epsilon=0.5",
                   "--dataset-version", "1", "--wait")
    assert old["dataset_version"] == 1 and old["status"] == "succeeded"
    spent = cli(service, "release", "create", "--dataset", dataset, "--mechanism",
                "laplace", "--params", MEAN_X, "--budget", "epsilon=0.1", ok=False)
    assert spent.stderr.startswith("error: budget_exhausted"), spent.stderr
    refused = cli(service, "datasets", "versions", "retire", dataset, "2", ok=False)
    assert refused.returncode == 1 and refused.stderr.startswith("error: version_current")
    assert cli_json(service, "datasets", "versions", "retire", dataset, "1")["status"] == (
        "retired")


def test_analyses_data_and_plot(service: Service, tmp_path: Path) -> None:
    ds = service.upload({"epsilon": 2, "interval_leakage": 0.9}, record_level=True)
    rid = cli_json(service, "release", "create", "--dataset", ds, "--mechanism",
                   "interval.case1", "--params", '{"column": "x", "calibrate": true}',
                   "--budget", "interval_leakage=0.5", "--wait")["id"]
    ran = cli(service, "analyses", "run", rid, "--analysis", "npmle", "--wait").stdout
    aid = field(ran, "id")
    assert field(ran, "status") == "succeeded" and field(ran, "release") == rid
    assert field(ran, "result.converged") == "yes"
    listed = cli(service, "analyses", "list", rid).stdout
    assert re.search(rf"^{aid}\s+npmle\s+succeeded\s", listed, re.MULTILINE), listed
    shown = cli_json(service, "analyses", "show", rid, aid)
    assert shown["id"] == aid and abs(sum(shown["result"]["mass"]) - 1) < 1e-9

    said = cli(service, "release", "data", rid, "-o", str(tmp_path / "d.csv")).stdout
    assert said.strip() == f"100 rows -> {tmp_path / 'd.csv'}"

    kde = cli_json(service, "release", "create", "--dataset", ds, "--mechanism",
                   "bernstein.kde", "--params", '{"column": "x"}', "--budget",
                   "epsilon=0.5", "--wait")["id"]
    png = tmp_path / "kde.png"
    said = cli(service, "release", "plot", kde, "-o", str(png)).stdout
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert said.strip() == f"{png.stat().st_size} bytes -> {png}"
    none = cli(service, "release", "plot", rid, "-o", str(tmp_path / "x.png"), ok=False)
    assert none.returncode == 1 and none.stderr.startswith("error: not_found: ")
    assert not (tmp_path / "x.png").exists()
    svg = tmp_path / "npmle.svg"  # the analysis's drawing, SVG by the file's suffix
    said = cli(service, "analyses", "plot", rid, aid, "-o", str(svg)).stdout
    assert svg.read_bytes().startswith(b"<?xml") and b"<svg" in svg.read_bytes()[:2000]
    assert said.strip() == f"{svg.stat().st_size} bytes -> {svg}"


def test_version_completion_and_every_page(service: Service, dataset: str) -> None:
    version = cli(service, "--version", key=None).stdout
    assert re.fullmatch(r"privrelease \S+ \(privrelease-client \d+\.\d+\.\d+\)\n", version)
    script = cli(service, "completion", "bash", key=None).stdout
    assert "_PRIVRELEASE_COMPLETE=bash_complete" in script
    env = {**env_for(service), "_PRIVRELEASE_COMPLETE": "bash_complete",
           "COMP_WORDS": "privrelease rel", "COMP_CWORD": "1"}
    done = subprocess.run([sys.executable, "-m", "service.processes.cli"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["plain,release"], done.stdout + done.stderr
    env.update(COMP_WORDS="privrelease jobs list --status q", COMP_CWORD="4")
    done = subprocess.run([sys.executable, "-m", "service.processes.cli"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["plain,queued"], done.stdout + done.stderr
    # suggested, not enforced: the server judges the filter (a newer one may know more)
    bogus = cli(service, "jobs", "list", "--status", "bogus", ok=False)
    assert bogus.returncode == 1 and bogus.stderr.startswith("error: validation_error: ")
    assert "(field: status)" in bogus.stderr

    for eps in ("0.1", "0.2", "0.3"):
        cli(service, "release", "create", "--dataset", dataset, "--mechanism", "laplace",
            "--params", MEAN_X, "--budget", f"epsilon={eps}")
    one_page = cli_json(service, "release", "list", "--dataset", dataset, "--limit", "1")
    every = cli_json(service, "release", "list", "--dataset", dataset, "--limit", "1",
                     "--all")
    assert len(one_page) == 1 and len(every) == 3
    assert {r["cost"]["epsilon"] for r in every} == {0.1, 0.2, 0.3}


def test_the_client_alone_answers_as_privrelease_does(service: Service, dataset: str) -> None:
    """``privrelease-client``, where the server's packages cannot be imported, against the
    live service: the same document as the server's ``privrelease``."""
    alone = client_alone("budget", "show", dataset, "--json", env=env_for(service))
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout) == cli_json(service, "budget", "show", dataset)


def test_the_notebook_example_runs(service: Service) -> None:
    """examples/notebook_client.py, as a user would run it against a live service."""
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "notebook_client.py")],
                          cwd=ROOT, env=env_for(service), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress line when stderr is not a terminal
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"dataset ds_\w+ 400 rows", lines[0])
    assert lines[1] == "estimate {'epsilon': 0.5} {'epsilon': 2.0}"
    assert "refused: epsilon requested 5.0 remaining 1.0" in lines
    assert "npmle succeeded" in lines
    assert lines[-1] == "['interval.case1', 'laplace', 'laplace']"


# -- registering Parquet already in storage (issue #30 item 2) --------------------------


def _parts(folder: Path, sizes: tuple[int, ...]) -> None:
    """Parquet files of ``META``'s columns under ``folder`` (x in [0, 0.9], g: u, v), and
    a ``_SUCCESS`` marker, as a Spark export leaves them."""
    folder.mkdir(parents=True)
    for k, n in enumerate(sizes):
        pq.write_table(pa.table({"x": [(i % 10) / 10 for i in range(n)],
                                 "g": ["uv"[i % 2] for i in range(n)]}),
                       folder / f"part-{k:05d}.parquet")
    (folder / "_SUCCESS").write_bytes(b"")


def test_datasets_and_versions_register_by_reference(service: Service, sources: Path,
                                                     tmp_path: Path) -> None:
    """Catches a ``register`` command that uploads instead of referencing, loses the
    metadata or a version flag, or hides the skipped marker; and the refusals: a source
    outside the server's root (its 403, exit 1) and metadata with a key given twice
    (refused before sending, exit 2), neither leaving a dataset."""
    folder = sources / "cli-people"
    _parts(folder, (40, 20))
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(META))
    before = len(cli_json(service, "datasets", "list"))
    out = cli(service, "datasets", "register", "--source", folder.as_uri(),
              "--metadata", str(meta)).stdout
    ds = field(out, "id")
    assert field(out, "rows") == "60" and field(out, "name") == "cli-people"
    assert "warning: skipped_objects: " in out and "(None)" not in out
    first = cli_json(service, "datasets", "versions", "show", ds, "1")
    assert first["source"]["url"] == folder.as_uri() and first["source"]["objects"] == 2
    assert field(cli(service, "datasets", "versions", "show", ds, "1").stdout,
                 "source") == folder.as_uri()

    changed = json.loads(json.dumps(META))
    changed["columns"]["x"]["bounds"] = [0, 2]
    one = (folder / "part-00001.parquet").as_uri()
    made = cli_json(service, "datasets", "versions", "register", ds, "--source", one,
                    "--metadata-json", json.dumps(changed), "--compatible",
                    "--make-current")
    assert (made["version"], made["n_rows"], made["current"]) == (2, 20, True)
    assert made["columns"]["x"]["bounds"] == [0, 2] and made["source"]["url"] == one
    kept = cli_json(service, "datasets", "versions", "register", ds, "--source", one)
    assert (kept["version"], kept["current"]) == (3, False)
    assert kept["columns"]["x"]["bounds"] == [0, 2]  # the dataset's current metadata
    rel = cli_json(service, "release", "create", "--dataset", ds, "--mechanism", "laplace",
                   "--params", MEAN_X, "--budget", "epsilon=0.5", "--wait")
    assert rel["status"] == "succeeded" and rel["dataset_version"] == 2

    outside = tmp_path / "elsewhere"
    _parts(outside, (10,))
    refused = cli(service, "datasets", "register", "--source", outside.as_uri(),
                  "--metadata", str(meta), ok=False)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: source_not_allowed: "), refused.stderr
    twice = cli(service, "datasets", "register", "--source", folder.as_uri(),
                "--metadata-json", '{"name": "a", "name": "b"}', ok=False)
    assert twice.returncode == 2 and "duplicate key 'name'" in twice.stderr
    neither = cli(service, "datasets", "register", "--source", folder.as_uri(), ok=False)
    assert neither.returncode == 2 and "exactly one of" in neither.stderr
    assert len(cli_json(service, "datasets", "list")) == before + 1


def test_the_client_registers_once_under_one_idempotency_key(service: Service,
                                                             sources: Path) -> None:
    """``Client.register_dataset``/``register_version`` against the live service: the
    same Idempotency-Key answers the first registration (no second dataset or version),
    the same key with other metadata is refused, and a source the server cannot find is
    its 422 as an ``ApiError``."""
    folder = sources / "client-people"
    _parts(folder, (30,))
    with Client(service.url, TOKEN) as c:
        before = {d["id"] for d in c.iter_datasets()}
        first = c.register_dataset(folder.as_uri(), META, idempotency_key="byref-1")
        again = c.register_dataset(folder.as_uri(), META, idempotency_key="byref-1")
        assert again["id"] == first["id"] and first["n_rows"] == 30
        with pytest.raises(ApiError) as mismatch:
            c.register_dataset(folder.as_uri(), {**META, "name": "other"},
                               idempotency_key="byref-1")
        assert mismatch.value.status == 422 and mismatch.value.code == "idempotency_mismatch"
        assert {d["id"] for d in c.iter_datasets()} - before == {first["id"]}

        version = c.register_version(first["id"], folder.as_uri(), make_current=True,
                                     idempotency_key="byref-v2")
        repeat = c.register_version(first["id"], folder.as_uri(), make_current=True,
                                    idempotency_key="byref-v2")
        assert version["version"] == repeat["version"] == 2 and version["current"]
        assert [v["version"] for v in c.list_versions(first["id"])] == [1, 2]
        with pytest.raises(ApiError) as missing:
            c.register_version(first["id"], (sources / "nothing-here").as_uri())
        assert missing.value.status == 422 and missing.value.code == "source_not_found"
