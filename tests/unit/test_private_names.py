"""No module of damon_hp uses another's private names: neither `from module import _name` nor
`module._name` (or `getattr(module, "_name")`) where `module` is a damon_hp module it imported.
A private name is one its module may change without a look elsewhere; a reach-in breaks that.
Dunder names (`__name__`, `__file__`) are everyone's. Read from the source with ast, so
function-level imports count too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[2] / "agent"
PACKAGE = AGENT / "damon_hp"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(AGENT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module an ImportFrom reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def module_aliases(tree: ast.Module, name: str, path: Path, known: set[str]) -> dict[str, str]:
    """Local name -> the damon_hp module it is bound to, anywhere in the file. Scopes are not
    told apart: a module imported in one function and a same-named local elsewhere is rare
    enough here, and the check errs towards reporting."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in known:
                    aliases[a.asname] = a.name
                elif not a.asname and a.name.split(".")[0] == "damon_hp":
                    aliases["damon_hp"] = "damon_hp"  # `import damon_hp.x` binds damon_hp
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, name, path)
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
    return aliases


def resolve(expr: ast.expr, aliases: dict[str, str], known: set[str]) -> str | None:
    """The damon_hp module an expression such as `kdamond` or `damon_hp.damon.kdamond` names."""
    if isinstance(expr, ast.Name):
        return aliases.get(expr.id)
    if isinstance(expr, ast.Attribute):
        outer = resolve(expr.value, aliases, known)
        if outer is not None and f"{outer}.{expr.attr}" in known:
            return f"{outer}.{expr.attr}"
    return None


def reach_ins(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """Each use in `path` (module `name`) of another damon_hp module's private name."""
    tree = ast.parse(path.read_text())
    aliases = module_aliases(tree, name, path, known)
    for node in ast.walk(tree):
        used: tuple[str | None, str] | None = None
        if isinstance(node, ast.ImportFrom):
            base = absolute(node, name, path)
            for a in node.names:
                if base in known and base != name and is_private(a.name):
                    yield f"{node.lineno}: from {base} import {a.name}"
        elif isinstance(node, ast.Attribute):
            used = resolve(node.value, aliases, known), node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            used = resolve(node.args[0], aliases, known), node.args[1].value
        if used is not None and used[0] not in (None, name) and is_private(used[1]):
            yield f"{node.lineno}: {used[0]}.{used[1]}"


def test_no_module_uses_another_modules_private_names() -> None:
    mods = modules()
    known = set(mods)
    found = [f"{path.relative_to(AGENT)}:{r}" for name, path in mods.items()
             for r in reach_ins(name, path, known)]
    assert not found, "\n".join(found)


# -- the checker itself, on code written for it --------------------------------------------------

SAMPLE = "damon_hp.experiment.sample"
KNOWN = {"damon_hp", "damon_hp.experiment", SAMPLE, "damon_hp.experiment.arms",
         "damon_hp.damon", "damon_hp.damon.kdamond", "damon_hp.testvm"}


def check(source: str, tmp_path: Path) -> list[str]:
    path = tmp_path / "sample.py"  # read as damon_hp/experiment/sample.py
    path.write_text(source)
    return [r.split(": ", 1)[1] for r in reach_ins(SAMPLE, path, KNOWN)]


@pytest.mark.parametrize(("source", "want"), [
    ("from damon_hp import testvm\ntestvm._Terminated\n", "damon_hp.testvm._Terminated"),
    ("from . import arms\narms._tool()\n", "damon_hp.experiment.arms._tool"),
    ("import damon_hp.damon.kdamond\ndamon_hp.damon.kdamond._x\n", "damon_hp.damon.kdamond._x"),
    ("def f():\n    from ..damon import kdamond as k\n    return k._x\n",
     "damon_hp.damon.kdamond._x"),
    ("from damon_hp import testvm\ngetattr(testvm, '_y')\n", "damon_hp.testvm._y"),
    ("from .arms import _tool\n", "from damon_hp.experiment.arms import _tool"),
])
def test_the_checker_finds_a_reach_in(source: str, want: str, tmp_path: Path) -> None:
    assert check(source, tmp_path) == [want]


@pytest.mark.parametrize("source", [
    "from damon_hp import testvm\ntestvm.VmTerminated, testvm.__name__, testvm.__file__\n",
    "from . import sample\nsample._own\n",           # a module's own private names
    "import subprocess\nsubprocess._args_from_interpreter_flags\n",  # not ours to police
    "from .arms import Arm\nArm._field\n",           # a class's, not a module's
])
def test_the_checker_lets_public_dunder_own_and_foreign_names_pass(source: str,
                                                                   tmp_path: Path) -> None:
    assert check(source, tmp_path) == []
