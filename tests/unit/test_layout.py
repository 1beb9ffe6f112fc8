"""The tree is the architecture: no import cycle, imports only go down the layers, envs depend on
the records alone, nothing outside ``pipeline/methods/`` reaches past the method registry, and one
module of ``pipeline/`` (``DOOR``) imports ``actors/`` and ``envs/``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "actors", "envs")

# What each layer may import from the project (besides itself). Orchestration and tools sit on top.
ALLOWED = {
    "pipeline.core": set(),
    "pipeline.models": {"pipeline.core"},
    "pipeline.algorithm": {"pipeline.core"},
    "pipeline.context": {"pipeline.core"},
    "pipeline.methods": {"pipeline.core", "pipeline.algorithm", "pipeline.context"},
    "pipeline.distributed": {"pipeline.core"},
    "actors": {
        "pipeline.core",
        "pipeline.algorithm",
        "pipeline.context",
        "pipeline.distributed",
        "pipeline.models",
        "envs",
    },
    "envs": {"pipeline.core.types"},
    "pipeline.orchestration": {
        "pipeline.core",
        "pipeline.algorithm",
        "pipeline.context",
        "pipeline.methods",
        "pipeline.distributed",
        "pipeline.models",
    },
    "pipeline.tools": {
        "pipeline.core",
        "pipeline.algorithm",
        "pipeline.context",
        "pipeline.methods",
        "pipeline.distributed",
        "pipeline.models",
        "pipeline.orchestration",
    },
}
# The one module of pipeline/ that imports actors/ and envs/: it starts the actors and hands the
# rest of pipeline/ their handles (and plain workers to the warm start and feedback selection).
DOOR = "pipeline.orchestration.launch"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports() -> dict[str, set[str]]:
    """Every project module -> the project modules it imports (at any depth: lazy imports count)."""
    modules = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}
        out[name] = {m for m in found if m in modules and m != name}
    return out


def layer(module: str) -> str:
    for name in sorted(ALLOWED, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    return module.split(".")[0]


def test_no_module_imports_itself_back_through_others():
    graph = imports()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    # a package's __init__ re-exporting its own submodules is not a cycle between roles
    real = [c for c in cycles if len({layer(m) for m in c}) > 1 or not any(m == layer(m) for m in c)]
    assert not real, f"import cycles: {real}"


def test_imports_only_go_down_the_layers():
    bad = []
    for module, deps in imports().items():
        own = layer(module)
        allowed = ALLOWED.get(own, set()) | ({"actors", "envs"} if module == DOOR else set())
        for dep in deps:
            target = layer(dep)
            if target == own or any(dep == a or dep.startswith(a + ".") for a in allowed):
                continue
            bad.append(f"{module} -> {dep}")
    assert not bad, "imports against the layering: " + ", ".join(sorted(bad))


def test_launch_is_the_one_module_of_pipeline_that_imports_actors_or_envs():
    doors = sorted(
        m
        for m, deps in imports().items()
        if m.startswith("pipeline") and any(d.startswith(("actors", "envs")) for d in deps)
    )
    assert doors == [DOOR], doors


def test_envs_depend_on_the_records_only():
    bad = [
        f"{m} -> {d}"
        for m, deps in imports().items()
        if m.startswith("envs")
        for d in deps
        if d.startswith(("pipeline", "actors")) and d != "pipeline.core.types"
    ]
    assert not bad, bad


def test_only_the_registry_is_imported_from_outside_the_methods_package():
    bad = [
        f"{m} -> {d}"
        for m, deps in imports().items()
        if not m.startswith("pipeline.methods")
        for d in deps
        if d.startswith("pipeline.methods.")
    ]
    assert not bad, bad


def test_the_package_docstring_lists_the_layers_in_the_order_imports_go():
    import re

    import pipeline

    order = [f"pipeline.{name}" for name in re.findall(r"^- ``(\w+)``", pipeline.__doc__, re.MULTILINE)]
    assert set(order) == {layer for layer in ALLOWED if layer.startswith("pipeline.")}
    for i, name in enumerate(order):
        below = {m for m in ALLOWED[name] if m.startswith("pipeline.")}
        assert below <= set(order[:i]), f"{name} imports {sorted(below - set(order[:i]))}, listed after it"


def test_the_product_imports_no_lab_code():
    """scripts/lab (result tables, statistics, fault injection) and its scipy serve scripts and
    tests; a run never needs them (``make train`` installs the product alone)."""
    bad = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("lab", "scipy")]
    assert not bad, bad
