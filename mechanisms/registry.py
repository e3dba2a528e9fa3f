"""Name -> mechanism lookup; names are part of the HTTP API (DESIGN §5)."""

from __future__ import annotations

from mechanisms.base import Mechanism

_REGISTRY: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    """Add a mechanism instance under its ``name``; a name is registered once."""
    if mechanism.name in _REGISTRY:
        raise ValueError(f"mechanism {mechanism.name!r} registered twice")
    _REGISTRY[mechanism.name] = mechanism
    return mechanism


def _load_builtin() -> None:
    # Importing the modules registers their mechanisms.
    from mechanisms import baselines  # noqa: F401


def get(name: str) -> Mechanism:
    """The mechanism called ``name``; KeyError if there is none."""
    _load_builtin()
    return _REGISTRY[name]


def names() -> list[str]:
    """All registered mechanism names, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)
