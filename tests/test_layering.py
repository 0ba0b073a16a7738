"""The project's own import graph has no cycle, and a long module says why it is long.

The graph: one node per module of `compiler/`, `tuner/`, `service/` and `bench/` (a package is its
`__init__`), one edge per `import` or `from ... import` that names another of them, read with `ast` from
the source, at module level and inside functions and classes alike (an import inside a function still
runs, later: it hides a cycle, it does not remove it). Imports under `if TYPE_CHECKING:` count too: they
never run, but two modules whose types need each other are one design split in two (import-linter, which
`make lint` runs, counts them as well).

How an import becomes an edge:

- `import a.b.c` and `from a.b.c import x` are edges to `a.b.c`; `from a.b import c`, where `a/b/c.py`
  (or `a/b/c/`) exists, is an edge to `a.b.c`, and otherwise (a name defined in `a/b/__init__.py`) an
  edge to the package `a.b`. Relative imports are resolved against the importing module's package.
- The parent packages that Python runs first are not edges: a package's `__init__` that imports its
  submodules is not a cycle by itself. A submodule that imports its own package (`from . import name`
  for a name of the `__init__`, `import compiler.workloads`) while that `__init__` imports the
  submodule is one, and is reported.

A cycle is a strongly connected component of more than one module; the failure lists each with one
closed path through it and the file and line of each import on that path.

Long modules: a module of more than `MAX_LINES` lines must say why in its docstring, with a line that
starts with the marker `Over 600 lines:` followed by the reason, e.g.

    Over 600 lines: the importer's table of converters, one short function per torch operator.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("compiler", "tuner", "service", "bench")
MAX_LINES = 600
MARKER = "over 600 lines:"


@dataclass(frozen=True)
class Edge:
    """One import: `source` imports `target` at `path:line`."""

    source: str
    target: str
    path: str
    line: int


def _modules() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (a package under its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, at any depth, in source order."""
    found = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    return sorted(found, key=lambda node: (node.lineno, node.col_offset))


def _deepest(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is one of our modules."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _edges(modules: dict[str, Path]) -> list[Edge]:
    edges: list[Edge] = []
    for source, path in modules.items():
        is_package = path.name == "__init__.py"
        package = source if is_package else source.rpartition(".")[0]
        rel = str(path.relative_to(ROOT))
        for node in _imports(ast.parse(path.read_text(), filename=rel)):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_deepest(alias.name, modules) for alias in node.names]
            else:
                if node.level:
                    base_parts = package.split(".")
                    if node.level > 1:
                        base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else _deepest(base, modules))
            for target in targets:
                if target is not None and target != source:
                    edges.append(Edge(source, target, rel, node.lineno))
    return edges


def _cycles(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), sorted."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for e in edges:
        if e.target not in succ[e.source]:
            succ[e.source].append(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        # recursion depth is bounded by the longest import chain: a few dozen modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                connect(w)
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
                components.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            connect(v)
    return sorted(components)


def _closed_path(component: list[str], edges: list[Edge]) -> list[Edge]:
    """One cycle through a component's first module, by breadth-first search inside the component."""
    inside = set(component)
    first: dict[tuple[str, str], Edge] = {}
    for e in edges:
        if e.source in inside and e.target in inside:
            first.setdefault((e.source, e.target), e)
    start = component[0]
    parent: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for (s, t), e in sorted(first.items()):
                if s != v:
                    continue
                if t == start:
                    path = [e]
                    while path[0].source != start:
                        path.insert(0, parent[path[0].source])
                    return path
                if t not in parent:
                    parent[t] = e
                    following.append(t)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")


def test_no_import_cycles():
    """No two modules of the project import each other, directly or through others."""
    modules = _modules()
    edges = _edges(modules)
    components = _cycles(list(modules), edges)
    lines = []
    for component in components:
        path = _closed_path(component, edges)
        lines.append(f"{len(component)} modules: {', '.join(component)}")
        lines.append("  " + " -> ".join([e.source for e in path] + [path[0].source]))
        lines.extend(f"    {e.source} -> {e.target}  ({e.path}:{e.line})" for e in path)
    assert not components, f"{len(components)} import cycles between the project's modules:\n" + "\n".join(lines)


def test_graph_sees_function_level_imports():
    """The walk reads imports inside functions and resolves relative ones (a check of the test itself)."""
    tree = ast.parse("def f():\n    from .b import x\n    import tuner.space\nif TYPE_CHECKING:\n    import bench\n")
    names = [(type(n).__name__, getattr(n, "module", None), n.lineno) for n in _imports(tree)]
    assert names == [("ImportFrom", "b", 2), ("Import", None, 3), ("Import", None, 5)], names
    modules = _modules()
    assert "compiler" in modules and "service.api" in modules, sorted(modules)[:10]
    assert len(_edges(modules)) > 500, len(_edges(modules))


def test_long_modules_say_why():
    """A module of more than MAX_LINES lines has a docstring line `Over 600 lines: <reason>`."""
    unexplained = []
    for name, path in _modules().items():
        source = path.read_text()
        count = source.count("\n") + (not source.endswith("\n") and bool(source))
        if count <= MAX_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(source)) or ""
        reasons = [
            line.strip()[len(MARKER) :].strip()
            for line in docstring.splitlines()
            if line.strip().lower().startswith(MARKER)
        ]
        if not any(reasons):
            unexplained.append(f"{path.relative_to(ROOT)} ({count} lines)")
    assert not unexplained, (
        f"modules over {MAX_LINES} lines without a line 'Over 600 lines: <reason>' in their docstring "
        f"(split them, or say why they are one job):\n  " + "\n  ".join(sorted(unexplained))
    )
