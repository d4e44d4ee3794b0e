"""The package's modules import each other without cycles (module-level imports, read statically)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "poptorch_sim"


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package ``__init__``) for every module of the package."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".")[: None if is_package else -1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def _is_type_checking_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)


def _imports(module: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The package modules ``module`` imports when it is loaded (top-level statements only).

    ``from pkg import sub`` needs ``pkg.sub``, not ``pkg``'s own names; the parent packages that
    any import loads first are left out, as Python finds a partly loaded parent's submodules.
    """
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if _is_type_checking_block(node):
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = (
                _absolute(module, is_package, node.level, node.module)
                if node.level
                else node.module or ""
            )
            subs = {f"{source}.{alias.name}" for alias in node.names}
            out.update(subs & known)
            if subs - known:
                out.add(source)
    return (out & known) - {module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_level_import_cycle() -> None:
    modules = _modules()
    known = set(modules)
    graph = {m: _imports(m, path, pkg, known) for m, (path, pkg) in modules.items()}
    cycles = _cycles(graph)
    described = [", ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles]
    assert not cycles, "module-level import cycles:\n" + "\n".join(described)


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
