"""No import circle inside ``lead/`` or inside ``service/`` (imports in functions count too).

Each module of a package is a node, and each import an edge to the module it runs:

- ``import p.a`` and ``from p.a import f`` are edges to ``p.a``;
- ``from p import a`` is an edge to ``p.a`` when ``a`` is a submodule, else to ``p`` itself
  (its ``__init__``), since the name ``a`` is read off the package.

``import p.a`` runs ``p/__init__`` first, but that is no edge to ``p``: Python finds ``p`` in
``sys.modules`` then, even half-run, and loads ``p.a`` from its file. Only a name read off
the package needs its ``__init__`` to have run to the end. So ``p/__init__`` may import its
submodules (to re-export their names) as long as none of them, directly or through other
modules, reads a name off ``p``: that is a circle through ``p`` in this graph, and it reads a
half-built package whenever ``import p`` comes first.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` at ``path`` imports, nested imports too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            package = name if path.name == "__init__.py" else name.rpartition(".")[0]
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
            module = node.module if node.level == 0 else ".".join(filter(None, [base, node.module]))
            assert module, f"{path}: cannot resolve an import"
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in known else module)
    return found & known


@pytest.mark.parametrize("package", ["lead", "service"])
def test_no_import_circle(package: str) -> None:
    paths = {_module_name(p): p for p in (ROOT / package).rglob("*.py")}
    known = set(paths)
    graph = {name: _imports(name, path, known) - {name} for name, path in paths.items()}
    assert sum(map(len, graph.values())) > len(graph), "the scan found few imports: wrong root?"
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:  # args[1]: each module is imported by the one after it
        circle = " -> ".join(reversed(exc.args[1]))
        raise AssertionError(f"import circle (a -> b: a imports b): {circle}") from None
