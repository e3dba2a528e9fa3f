"""A mechanism's summary is its description's first sentence, never cut at an abbreviation
(#31 item 6: the catalog's and the console's summaries stopped at "i.i.d." and "et al.")."""

from __future__ import annotations

from typing import Any

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


def _undescribed(schema: dict[str, Any], path: str = "") -> list[str]:
    """The properties of a JSON schema (nested objects, list items and map values
    included) that have no description, as dotted paths."""
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        if not str(sub.get("description") or "").strip():
            out.append(path + name)
        out += _undescribed(sub, f"{path}{name}.")
        if isinstance(sub.get("items"), dict):
            out += _undescribed(sub["items"], f"{path}{name}[].")
        if isinstance(sub.get("additionalProperties"), dict):
            out += _undescribed(sub["additionalProperties"], f"{path}{name}{{}}.")
    return out


def test_every_registered_mechanisms_parameters_are_described() -> None:
    """#31 item 6: every parameter of every registered mechanism (a new one included) has a
    description for the CLI, the console's forms and the OpenAPI document; so do the fields
    of its nested objects (a kernel's rho, an anchor law's scale)."""
    from service.api.catalog import _catalog

    catalog = _catalog(tuple(mechanisms.names()))
    assert len(catalog) >= 30  # the registry, not a hand-kept list
    top_level = {d["name"]: [p for p, schema in d["params_schema"].get("properties", {}).items()
                             if not str(schema.get("description") or "").strip()]
                 for d in catalog}
    assert {name: props for name, props in top_level.items() if props} == {}
    nested = {d["name"]: _undescribed(d["params_schema"]) for d in catalog}
    assert {name: paths for name, paths in nested.items() if paths} == {}


def test_a_number_or_keyword_parameter_has_a_json_type_and_says_both() -> None:
    """#31: fields that take a number or a keyword (``components``: a whole number or
    ``auto``; ``smoothing.eta``) had no JSON type, so the CLI showed "any" and the console
    asked for JSON. Their schema is now an ``anyOf`` of the number's range and the
    keywords, which the CLI shows."""
    from privrelease_client import terminal
    from rich.console import Console

    from service.api.catalog import _catalog

    catalog = {d["name"]: d for d in _catalog(tuple(mechanisms.names()))}
    components = catalog["frl.mean"]["params_schema"]["properties"]["components"]
    number, keyword = components["anyOf"]
    assert number["type"] == "number" and number["minimum"] == 0.0
    assert number["exclusiveMinimum"] is True and number["maximum"] > 0
    assert keyword == {"type": "string", "enum": ["auto"]}
    eta = catalog["iclp.mean"]["params_schema"]["properties"]["smoothing"]["properties"]["eta"]
    assert [b["type"] for b in eta["anyOf"]] == ["number", "string"]
    console = Console(width=240, record=True)
    console.print(terminal.render_mechanism(catalog["frl.mean"]))
    row = next(line for line in console.export_text().splitlines()
               if line.lstrip("│ ").startswith("components"))
    assert "number or string" in row and "auto" in row and f"..{number['maximum']}" in row


def test_every_whole_number_parameter_is_strict() -> None:
    """A whole-number parameter takes a JSON integer only: ``"3"`` or ``3.0`` were quietly
    read as 3 by ``exm.draws`` and ``opm.mean``'s ``k`` (every other one refused them)."""
    from marshmallow import ValidationError

    for name, field, ok in (("exm", "draws", 3), ("opm.mean", "k", 3)):
        mech = mechanisms.get(name)
        base = {"column": "x"} if name == "exm" else {"columns": ["x"], "moment_bound": 1.0}
        assert mech.load_params({**base, field: ok})[field] == ok
        for bad in ("3", 3.0, True):
            with pytest.raises(ValidationError) as refused:
                mech.load_params({**base, field: bad})
            assert field in refused.value.messages, (name, bad)
