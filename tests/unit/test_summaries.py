"""A mechanism's summary is its description's first sentence, never cut at an abbreviation
(#31 item 6: the catalog's and the console's summaries stopped at "i.i.d." and "et al.")."""

from __future__ import annotations

import pytest

import mechanisms
from mechanisms.base import first_sentence


@pytest.mark.parametrize(("text", "first"), [
    ("Adds noise. Then rounds.", "Adds noise."),
    ("FRL: i.i.d. Laplace noise on M coefficients. Baseline.",
     "FRL: i.i.d. Laplace noise on M coefficients."),
    ("The baseline (Mirshani et al. 2019) with exact noise. More.",
     "The baseline (Mirshani et al. 2019) with exact noise."),
    ("Uses e.g. Laplace. Or Gaussian.", "Uses e.g. Laplace."),
    ("Cut at 3.5 units? Yes.", "Cut at 3.5 units?"),
    ("One sentence\n   over lines", "One sentence over lines"),
    ("", ""),
])
def test_first_sentence(text: str, first: str) -> None:
    assert first_sentence(text) == first


def test_no_registered_summary_ends_on_an_abbreviation() -> None:
    for name in mechanisms.names():
        description = mechanisms.get(name).description
        summary = first_sentence(description)
        assert summary, name
        assert " ".join(description.split()).startswith(summary), name
        last = summary.rstrip(".").rsplit(" ", 1)[-1].lower()
        assert last not in {"i.i.d", "al", "e.g", "i.e"}, (name, summary)


def test_the_baselines_parameters_are_described_and_shown_with_what_they_allow() -> None:
    """#31 item 6: `privrelease mechanisms laplace` showed "-" for every parameter's
    description and left out the allowed values."""
    from privrelease_client import terminal
    from rich.console import Console

    from service.api.catalog import _catalog

    catalog = {d["name"]: d for d in _catalog(tuple(mechanisms.names()))}
    for name in ("laplace", "gaussian", "geometric"):
        props = catalog[name]["params_schema"]["properties"]
        undescribed = [p for p, schema in props.items() if not schema.get("description")]
        assert not undescribed, (name, undescribed)
    console = Console(width=200, record=True)
    console.print(terminal.render_mechanism(catalog["laplace"]))
    shown = console.export_text()
    assert "count, sum, mean, histogram, quantile" in shown
    assert "1..10000" in shown and "0.0..1.0; 1..99 items" in shown
    assert "the levels, each in [0, 1] (0.5: the median)" in shown  # whole, not cut
