"""The experiment package's imports: no module of it imports back, directly or through others,
into one that imports it (top-level and function-level imports alike, read from the source),
no module imports another's private names, and each module imports on its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"
ROOT = AGENT / "damon_hp/experiment"


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(AGENT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(path: Path, name: str, known: set[str]) -> tuple[set[str], list[str]]:
    """The package's modules that `name` imports (anywhere in it) and the private names it
    imports from them."""
    found: set[str] = set()
    private: list[str] = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [(base, a.name) for a in node.names]
        else:
            continue
        for mod, attr in targets:
            if attr is not None and f"{mod}.{attr}" in known:
                found.add(f"{mod}.{attr}")  # `from package import module`
            elif mod in known:
                found.add(mod)
                if attr and attr.startswith("_") and mod != name:
                    private.append(f"{name} imports {mod}.{attr}")
    found.discard(name)
    return found, private


def test_the_experiment_package_has_no_import_cycle_and_no_private_reach_ins() -> None:
    mods = modules()
    graph, private = {}, []
    for name, path in mods.items():
        graph[name], bad = imports_of(path, name, set(mods))
        private += bad
    assert not private, private
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(m):] + [m]))
            if m not in state:
                visit(m)
        path.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


def test_each_experiment_module_imports_on_its_own() -> None:
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    for m in [k for k in sys.modules if k.startswith('damon_hp')]:\n"
              "        del sys.modules[m]\n"
              "    importlib.import_module(name)\n")
    r = subprocess.run([sys.executable, "-c", script, *modules()], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
