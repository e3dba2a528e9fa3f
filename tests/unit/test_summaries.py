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
