"""The mechanism catalog: names, measures and parameter schemas."""

from __future__ import annotations

import functools
from typing import Any

import marshmallow
from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from flask_smorest import Blueprint

import mechanisms
from mechanisms.base import first_sentence
from service.api.auth import require
from service.api.responses import AUTH, problems
from service.api.schemas import MechanismSchema

blp = Blueprint("mechanisms", __name__, url_prefix="/v1/mechanisms",
                description="Mechanism catalog")


def json_schema(schema: type[marshmallow.Schema]) -> dict[str, Any]:
    # a resolver that names nothing ("") makes apispec inline nested schemas: no dangling $ref
    plugin = MarshmallowPlugin(schema_name_resolver=lambda _schema: "")
    APISpec("catalog", "1", "3.0.3", plugins=[plugin])
    converted: dict[str, Any] = plugin.converter.schema2jsonschema(  # type: ignore[union-attr]
        schema
    )
    return converted


@blp.route("")
@require("consumer")
@problems(blp, *AUTH)
@blp.response(200, MechanismSchema(many=True))
def list_mechanisms() -> list[dict[str, Any]]:
    """Every mechanism with the measures it charges and its parameter schema."""
    return _catalog(tuple(mechanisms.names()))


@functools.cache
def _catalog(names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Built once per set of registered mechanisms (once per process, unless a plugin
    registers one later): converting every schema takes tens of milliseconds."""
    out = []
    for name in names:
        mech = mechanisms.get(name)
        out.append({"name": name, "measures": list(mech.measures),
                    "description": mech.description,
                    "summary": first_sentence(mech.description),
                    "params_schema": json_schema(mech.params_schema),
                    # only what some release of the mechanism can run; each succeeded
                    # release lists those its own design admits (``analyses``)
                    "analyses": {a: json_schema(an.params_schema)
                                 for a, an in sorted(mech.analyses.items())
                                 if an.offered_by(name)}})
    return out
