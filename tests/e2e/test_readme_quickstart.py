"""The README's quick start runs as pasted against `privrelease standalone`.

The shell block under "## Quick start" is taken from README.md itself, so an edit that
breaks it (a placeholder id, a renamed field, a wrong route) fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT
from tests.e2e.harness import Service


def quick_start_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found is not None
    return found.group(1)


def test_quick_start_runs_as_pasted(tmp_path: Path) -> None:
    svc = Service(tmp_path / "var", env={"PRIVRELEASE_BOOTSTRAP_KEY": ""})
    svc.start()
    try:
        env = {**os.environ, "PRIVRELEASE_URL": svc.url}
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", quick_start_block()],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
    finally:
        svc.stop()
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
