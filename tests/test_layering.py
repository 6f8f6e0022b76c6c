"""Layers that point one way: no import circle between workbench modules, nor between its folders taken as units
(module-level and function-level imports both count), and imports at the top of every module that imports torch,
transformers or pandas at the top anyway (deferral is for the light entry modules only)."""

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
HEAVY = {"torch", "transformers", "pandas"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


@functools.cache
def parsed(path: Path) -> ast.Module:
    """Each module parsed once for every test of this file."""
    return ast.parse(path.read_text())


def imported(path: Path, module: str):
    """(imported workbench module, whether the import sits inside a function) for each import of the file."""
    return _imported(path, module)


@functools.cache
def _imported(path: Path, module: str) -> tuple[tuple[str, bool], ...]:
    return tuple(_imports(path, module))


def _imports(path: Path, module: str):
    tree = parsed(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name not in (module, "workbench"):
                yield name, id(node) in inside


def graph(unit=lambda m: m) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for target, _ in imported(path, module):
            if unit(module) != unit(target):
                edges.setdefault(unit(module), set()).add(unit(target))
    return edges


def folder(module: str) -> str:
    """A module's folder as a unit (`workbench.probes.dtype`); top-level modules are units of their own."""
    return module if MODULES[module].name == "__init__.py" or module.count(".") == 1 else module.rpartition(".")[0]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_planted_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("unit", [lambda m: m, folder], ids=["modules", "folders"])
def test_no_import_circle(unit):
    assert circles(graph(unit)) == []


def test_modules_that_import_the_stack_at_the_top_import_the_workbench_at_the_top_too():
    deferred = []
    for module, path in MODULES.items():
        tree = parsed(path)
        top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names} | \
              {(n.module or "").split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom)}
        if top & HEAVY:
            deferred += [f"{module} -> {target}" for target, inside in imported(path, module) if inside]
    assert deferred == []


def test_no_private_name_is_imported_across_modules():
    crossing = []
    for module, path in MODULES.items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workbench"):
                crossing += [f"{module}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert crossing == []


def probe_area(module: str) -> str | None:
    """`workbench.probes.saved.files` -> "saved"; None outside the probe areas."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["workbench", "probes"] else None


def test_no_probe_area_imports_another():
    """Helpers two probe areas share live in workbench/model (LoRA math, the dtype tracer, the run's configuration),
    so each area reads only its own modules and the layers below."""
    sideways = sorted(f"{m} -> {dep}" for m, deps in graph().items() for dep in deps
                      if probe_area(m) and probe_area(dep) and probe_area(m) != probe_area(dep))
    assert sideways == [], sideways
