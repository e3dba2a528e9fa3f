"""No module of the service reads another module's private (``_name``) names.

A helper several modules need is public in the module that owns it (issue #28 item 6).
Every .py file under mechanisms/, service/ and workers/ is parsed with ``ast``; the test
fails on ``from X import _name`` and on ``alias._name`` where ``alias`` is bound by an
import to a module. Dunder names (``__version__``) are not private in this sense, and
tests themselves may still read private names.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("mechanisms", "service", "workers")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module (a file or a package of this tree, or installed)."""
    local = ROOT.joinpath(*dotted.split("."))
    if local.with_suffix(".py").is_file() or (local / "__init__.py").is_file():
        return True
    if dotted.split(".")[0] in PACKAGES:
        return False
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def _resolve_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a (possibly relative) ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None for anything but a chain of names."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else [*head, node.attr]
    return None


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Each private name ``source`` (the text of module ``module``) reads from another module."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    aliases: dict[str, str] = {}  # local name -> the module an import bound it to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom):
            origin = _resolve_from(node, module, is_package)
            for a in node.names:
                if a.name == "*":
                    continue
                if _private(a.name) and origin != module:
                    found.append((node.lineno, f"from {origin} import {a.name}"))
                if _is_module(f"{origin}.{a.name}"):
                    aliases[a.asname or a.name] = f"{origin}.{a.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        chain = _dotted(node.value)
        if chain is None or chain[0] not in aliases:
            continue
        owner = ".".join([aliases[chain[0]], *chain[1:]])
        if owner != module and (len(chain) == 1 or _is_module(owner)):
            found.append((node.lineno, f"{'.'.join(chain)}.{node.attr}"))
    return [f"{module}:{line}: {text}" for line, text in sorted(found)]


def test_no_cross_module_private_names() -> None:
    files = sorted(f for p in PACKAGES for f in (ROOT / p).rglob("*.py"))
    assert files
    found = [v for f in files for v in violations(
        f.read_text(encoding="utf-8"), _module_name(f), is_package=f.name == "__init__.py")]
    assert not found, "private names read across modules:\n" + "\n".join(found)


def test_the_check_sees_both_forms() -> None:
    """The checker itself: both forms are caught; dunders and attributes of objects are not."""
    source = (
        "from mechanisms.dp import baselines\n"
        "from mechanisms.base import _hidden, __doc__ as d\n"
        "import mechanisms.dp.vectors as vec\n"
        "x = baselines._thing\n"
        "y = vec._other\n"
        "z = vec.__name__\n"
        "class K:\n"
        "    def f(self):\n"
        "        return self._own\n"
        "from . import rows\n"
        "w = rows._relative\n"
        "import mechanisms.sampling\n"
        "v = mechanisms.sampling._deep\n"
        "u = K()._fine\n"
    )
    found = violations(source, "mechanisms.probe")
    assert [v.split(": ", 1)[1] for v in found] == [
        "from mechanisms.base import _hidden", "baselines._thing", "vec._other",
        "rows._relative", "mechanisms.sampling._deep"]
