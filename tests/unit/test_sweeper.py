"""PRIVRELEASE_MAX_RESENDS: how often the sweeper re-sends a lost job before refunding it."""

from __future__ import annotations

import pytest

from service.config import Config
from service.releases import sweeper


def test_max_resends_is_read_defaults_to_the_sweepers_bound_and_refuses_negatives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the setting not read (the sweeper's default whatever the operator set),
    a default that differs from the sweeper's own, and a negative or malformed bound."""
    monkeypatch.delenv("PRIVRELEASE_MAX_RESENDS", raising=False)
    assert Config.from_env().max_resends == sweeper.MAX_RESENDS == 3
    monkeypatch.setenv("PRIVRELEASE_MAX_RESENDS", "0")  # refund at once, as before re-sends
    assert Config.from_env().max_resends == 0
    for bad in ("-1", "x"):
        monkeypatch.setenv("PRIVRELEASE_MAX_RESENDS", bad)
        with pytest.raises(SystemExit, match="PRIVRELEASE_MAX_RESENDS"):
            Config.from_env()
