"""The distribution's version, in one place (the User-Agent and ``--version`` show it)."""

from __future__ import annotations

__version__ = "0.2.0"
