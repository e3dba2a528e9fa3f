"""The manual's guides run as pasted against `privrelease standalone`.

Each block marked ``<!-- run by tests/e2e/test_manual_blocks.py -->`` in ``docs/`` is
taken from its page (tests/unit/test_manual.py holds every other shell or Python block to
a reason why not), so an edit that breaks one (a placeholder id, a renamed field, a wrong
route) fails here: the quick start's shell session, the operator guide's registration by
reference, the analyst guide's notebook session.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.e2e.harness import Service
from tests.manual_site import run_blocks


def quick_start_block() -> str:
    (block,) = run_blocks("guides/quickstart.md")
    assert block.lang == "sh"
    return block.body


def quick_start_setup() -> str:
    """The quick start's first lines (``KEY``, ``URL``, ``AUTH`` and ``json``), which the
    operator guide's blocks assume."""
    setup = quick_start_block().split("\n\n")[0]
    assert "AUTH=" in setup and "json()" in setup
    return setup


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Service]]:
    """A folder as a reader's checkout after `make run`: var/ (with var/bootstrap-key) and
    a source root under it, for every block of this module."""
    cwd = tmp_path_factory.mktemp("reader")
    svc = Service(cwd / "var", env={
        "PRIVRELEASE_BOOTSTRAP_KEY": "",
        "PRIVRELEASE_SOURCE_ROOTS": f"file://{cwd}/var/sources"})
    svc.start()
    try:
        yield cwd, svc
    finally:
        svc.stop()


def _bash(script: str, cwd: Path, svc: Service) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PRIVRELEASE_URL": svc.url}
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_quick_start_runs_as_pasted(workdir: tuple[Path, Service]) -> None:
    cwd, svc = workdir
    done = _bash(quick_start_block(), cwd, svc)
    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"dataset ds_\w+", lines[0]), lines[0]
    estimate = json.loads(lines[1])
    assert estimate["cost"]["epsilon"] == 0.5
    assert isinstance(json.loads(lines[2])["value"], float)
    accuracy = json.loads(lines[3])  # the interval the comment beside it explains
    assert round(accuracy["ci95_halfwidth"]) == 164, accuracy
    budget = json.loads(lines[4])
    assert budget["measures"]["epsilon"]["committed"] == 0.5


def test_the_operator_guide_registers_parquet_by_reference(
        workdir: tuple[Path, Service]) -> None:
    """After the guide's `mkdir` (its `make run` is this module's service, started with the
    same source root), the block writes two Parquet parts, registers the folder and then
    one file as version 2."""
    cwd, svc = workdir
    (block,) = run_blocks("guides/operator.md")
    (cwd / "var" / "sources" / "people").mkdir(parents=True, exist_ok=True)
    # the block runs `.venv/bin/python` of the checkout: here, this interpreter
    venv = cwd / ".venv" / "bin"
    venv.mkdir(parents=True, exist_ok=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "python").chmod(0o755)
    done = _bash(quick_start_setup() + "\n" + block.body, cwd, svc)
    assert done.returncode == 0, done.stderr + done.stdout
    source, version = done.stdout.splitlines()
    pinned = json.loads(source)  # the shape the comment under it shows
    assert pinned["url"] == f"file://{cwd}/var/sources/people"
    assert pinned["objects"] == 2 and pinned["skipped"] == 0
    assert {"bytes", "pins_sha256"} <= set(pinned)
    assert version == "2"


def test_the_api_reference_finds_the_budget_for_a_target(
        workdir: tuple[Path, Service]) -> None:
    """The block under "The budget for a target accuracy", after the quick start's setup,
    on the dataset its comment names: 10,000 rows of age in [18, 100]."""
    cwd, svc = workdir
    (block,) = run_blocks("reference/api.md")
    key = (cwd / "var" / "bootstrap-key").read_text().strip()
    ages = "".join(f"{18 + (i * 37) % 83}\n" for i in range(10_000))
    made = requests.post(svc.url + "/v1/datasets", headers={"Authorization": f"Bearer {key}"},
                         files={"file": ("ages.csv", "age\n" + ages)},
                         data={"metadata": json.dumps({
                             "name": "ages", "budgets": {"epsilon": 5},
                             "columns": {"age": {"type": "integer", "bounds": [18, 100]}}})},
                         timeout=60)
    assert made.status_code == 201, made.text
    done = _bash(f"DS={made.json()['id']}\n" + quick_start_setup() + "\n" + block.body,
                 cwd, svc)
    assert done.returncode == 0, done.stderr + done.stdout
    answer = json.loads(done.stdout)
    # the figures the block's comment shows
    assert answer["budget"] == {"epsilon": 0.491403398}, answer["budget"]
    assert answer["target"]["stated_half_width"] <= 0.05
    assert answer["target"]["evaluations"] == 32


#: what the analyst guide's session assumes: ``ds``, a dataset admitting its releases
#: (examples/notebook_client.py's upload)
ANALYST_SETUP = '''
import random
from privrelease_client import Client
rng = random.Random(7)
rows = [(round(rng.betavariate(2, 5), 4), rng.choice("abc")) for _ in range(400)]
csv = "income,group\\n" + "".join(f"{x},{g}\\n" for x, g in rows)
ds = Client().upload_dataset(csv.encode(), {
    "name": "analyst-guide",
    "columns": {"income": {"type": "continuous", "bounds": [0, 1]},
                "group": {"type": "categorical", "categories": ["a", "b", "c"]}},
    "budgets": {"epsilon": 2, "interval_leakage": 0.9}, "record_level": True})["id"]
'''


def test_the_analyst_guide_notebook_session_runs(workdir: tuple[Path, Service]) -> None:
    cwd, svc = workdir
    (block,) = run_blocks("guides/analyst.md")
    assert block.lang == "python"
    check = ('\nprint("status", mean.status, records.status)'
             '\nprint("frames", len(records.data().to_pandas()), len(mean.to_pandas()))'
             '\nprint("releases", len(list(client.iter_releases(dataset_id=ds))))\n')
    env = {**os.environ, "PRIVRELEASE_URL": svc.url,
           "PRIVRELEASE_KEY": (cwd / "var" / "bootstrap-key").read_text().strip()}
    done = subprocess.run([sys.executable, "-c", ANALYST_SETUP + block.body + check],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr + done.stdout
    lines = done.stdout.splitlines()
    # the refusal the guide prints: ε 5 asked, 2 - 0.5 left
    assert "epsilon 5.0 1.5" in lines, lines
    assert "status succeeded succeeded" in lines
    assert "frames 400 1" in lines
    assert "releases 2" in lines
