"""A drafted template, completed where the draft says to, registers as it is (#31 item 8);
left as drafted (bounds null, no budget), it is refused naming what is missing."""

from __future__ import annotations

from pathlib import Path

from privrelease_client.draft import draft

from tests.integration.conftest import Api, people_csv


def test_a_completed_draft_registers_and_an_incomplete_one_is_refused(
        api: Api, tmp_path: Path) -> None:
    path = tmp_path / "people.csv"
    path.write_text(people_csv(50))
    meta = draft(path).metadata
    refused = api.upload(path.read_text(), meta)
    assert refused.status_code == 422, refused.get_json()
    assert refused.get_json()["field"].startswith("metadata.")
    meta["columns"]["age"]["bounds"] = [0, 120]
    meta["columns"]["income"]["bounds"] = [0, 2000]
    meta["budgets"] = {"epsilon": 1}
    made = api.upload(path.read_text(), meta)
    assert made.status_code == 201, made.get_json()
    assert made.get_json()["columns"]["group"]["categories"] == ["a", "b", "c"]
