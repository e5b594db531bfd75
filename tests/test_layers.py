"""The package's layers point one way: no import cycle, and no import hidden inside a function
to dodge one (docs/architecture.md, Where things live)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "lit_agents"
def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _runtime_imports(path: Path, modules: dict[str, Path]) -> tuple[set[str], list[tuple[int, str]]]:
    """(lit_agents modules imported when ``path`` is, imports inside functions)."""
    tree = ast.parse(path.read_text())
    top, nested = set(), []

    def names(node: ast.AST) -> list[str]:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lit_agents"):
            found = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        else:
            return []
        return [n for n in found if n in modules]

    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue  # annotations only
        for sub in ast.walk(node):
            found = names(sub)
            if not found:
                continue
            inside = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not node
            if inside:
                nested.append((sub.lineno, found[0]))
            else:
                top.update(found)
    return top, nested


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_import_inside_a_function_dodges_a_cycle():
    modules = _modules()
    offenders = []
    for name, path in modules.items():
        rel = str(path.relative_to(PACKAGE))
        _, nested = _runtime_imports(path, modules)
        offenders += [f"{rel}:{line} imports {what}" for line, what in nested]
    assert not offenders, offenders


def test_the_packages_form_layers_without_a_cycle():
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        top, _ = _runtime_imports(path, modules)
        graph.setdefault(_package(name), set()).update(_package(t) for t in top if _package(t) != _package(name))
    order, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import cycle: {' -> '.join(trail + [node])}"
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            visit(dep, trail + [node])
        state[node] = "done"
        order.append(node)

    for node in sorted(graph):
        visit(node, [])
    # the data model sits at the bottom; environments know nothing of models, agents or training
    assert graph["types"] == set()
    assert graph["envs"] <= {"types"}
    assert not graph["agents"] & {"data", "modules", "cli"}


def test_no_module_import_cycle_and_every_module_imports_in_a_fresh_process():
    """No cycle among the modules either (so any import order works), and every module imports
    in a fresh interpreter."""
    modules = _modules()
    graph = {name: _runtime_imports(path, modules)[0] - {name} for name, path in modules.items()}
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import cycle: {' -> '.join(trail + [node])}"
        state[node] = "open"
        for dep in sorted(graph[node]):
            visit(dep, trail + [node])
        state[node] = "done"

    for node in sorted(graph):
        visit(node, [])
    names = sorted(n for n in modules if not n.endswith("_repl_worker"))
    code = f"import importlib\nfor name in {names!r}:\n    importlib.import_module(name)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_wheel_packages_every_subpackage():
    """setuptools' explicit package list names every folder of the package (a missing one
    installs from a checkout in editable mode and is absent from the wheel)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert folders <= listed, folders - listed
