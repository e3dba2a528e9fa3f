"""Name -> mechanism lookup; names are part of the HTTP API (DESIGN §5)."""

from __future__ import annotations

import functools
import importlib

from mechanisms.base import Mechanism

_REGISTRY: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    """Add a mechanism instance under its ``name``; a name is registered once."""
    if mechanism.name in _REGISTRY:
        raise ValueError(f"mechanism {mechanism.name!r} registered twice")
    _REGISTRY[mechanism.name] = mechanism
    return mechanism


#: modules whose import registers their mechanisms (one per line)
BUILTIN = [
    "mechanisms.dp",
    "mechanisms.subset",
    "mechanisms.interval",
    "mechanisms.dip",
    "mechanisms.iclp",
    "mechanisms.noiseless",
    "mechanisms.competitors",
]


@functools.cache
def _load_builtin() -> None:
    for module in BUILTIN:
        importlib.import_module(module)


def get(name: str) -> Mechanism:
    """The mechanism called ``name``; KeyError if there is none."""
    _load_builtin()
    return _REGISTRY[name]


def names() -> list[str]:
    """All registered mechanism names, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)
