"""The layers import one way (ARCHITECTURE.md): workers -> service -> mechanisms, and
inside ``service`` processes -> HTTP edge -> domain -> storage.

Every import of every module (at the top or inside a function) is read with ``ast``; a
module that reaches up a layer fails here, naming the import.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the service's packages by layer; a module not listed is the domain (``service/*.py``,
#: ``service/releases/``)
EDGE = ("service.api", "service.console")
PROCESSES = ("service.processes",)
STORAGE = ("service.storage",)
#: what the storage layer may import besides itself: leaves with no service imports
STORAGE_MAY = ("service.config", "service.errors", "service.releases.queue")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports (``from a import b`` counts ``a`` and ``a.b``)."""
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
            out += [f"{node.module}.{alias.name}" for alias in node.names]
    return out


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _modules(package: str) -> list[tuple[str, list[str]]]:
    return [(_module(p), _imports(p)) for p in sorted((ROOT / package).rglob("*.py"))]


def _violations(package: str, allowed: Callable[[str, str], bool]) -> list[str]:
    return [f"{module} imports {name}" for module, names in _modules(package)
            for name in names if name.split(".")[0] in {"service", "workers", "mechanisms"}
            and not allowed(module, name)]


def test_mechanisms_import_nothing_of_the_service_or_the_workers() -> None:
    assert _violations("mechanisms", lambda _m, n: n.startswith("mechanisms")) == []


def test_the_service_never_imports_the_workers() -> None:
    assert _violations("service", lambda _m, n: not n.startswith("workers")) == []


@pytest.mark.parametrize("layer", ["domain", "edge", "storage"])
def test_each_service_layer_imports_only_down(layer: str) -> None:
    def allowed(module: str, name: str) -> bool:
        if not name.startswith("service"):
            return True
        if _under(module, PROCESSES):
            return True
        if _under(module, EDGE):
            return layer != "edge" or not _under(name, PROCESSES)
        if _under(module, STORAGE):
            return (layer != "storage" or name == "service"
                    or _under(name, STORAGE + STORAGE_MAY))
        # the domain
        return layer != "domain" or not _under(name, EDGE + PROCESSES)

    assert _violations("service", allowed) == []


def test_the_domain_and_storage_know_no_http_framework() -> None:
    """No Flask or Werkzeug below the HTTP edge (``wiring.current``, the edge's accessor
    of the services, imports Flask inside the function that needs it)."""
    below = [(m, n) for m, names in _modules("service") for n in names
             if not _under(m, EDGE + PROCESSES) and n.split(".")[0] in {"flask", "werkzeug"}]
    assert below == [("service.wiring", "flask"), ("service.wiring", "flask.current_app")]


def test_the_scan_sees_an_upward_import(tmp_path: Path) -> None:
    """The check can fail: an import of the HTTP edge from the storage layer is found."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from service.api.problems import APIError\n")
    assert "service.api.problems" in _imports(module)
    assert _under("service.api.problems", EDGE) and not _under("service.api", STORAGE)
