"""The package's layers: no module imports from a layer above its own, and no import circle.

Layers, lowest first (docs/ARCHITECTURE.md): errors and helpers -> data, graph, penalties,
metrics -> problem, checkpoint, exchange -> solver -> api -> config, inputs -> experiments,
runner and its outputs -> audit, CLI. Imports inside functions count too (a lazy import is
still a dependency).
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ppdnmf_torch"

#: module (or subpackage) -> layer; a module may import only from its own layer or below,
#: and within a layer only without a circle
LAYERS = {
    "errors": 0, "_utils": 0, "threads": 0, "folderlock": 0,
    "data": 1, "graph": 1, "penalties": 1, "metrics": 1, "diagnostics": 1,
    "problem": 2, "checkpoint": 2, "exchange": 2,
    "solver": 3, "consensus": 3,
    "api": 4,
    "config": 5, "estimator": 5, "inputs": 6,
    "experiments": 7, "loggers": 7, "progress": 7, "outputs": 7, "costs": 7, "rundir": 7, "tensorboard": 8,
    "runner": 8,
    "audit": 9, "cli": 10, "__main__": 11, "__init__": 11,
    # above the CLI: its app reuses the CLI's config conversion; nothing imports it
    "distributed": 11,
    # the models' packages (each imports the engine below it, never another model or the app)
    "models": 4,
}


def _unit(module: str) -> str:
    """``ppdnmf_torch.solver.admm`` -> ``solver``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, module: str):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("ppdnmf_torch"):
                if node.module:  # "from . import x" imports x, not the package
                    yield target, node.lineno
                for alias in node.names:  # from . import solver
                    yield f"{target}.{alias.name}", node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("ppdnmf_torch"):
                    yield alias.name, node.lineno


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts)


def test_every_unit_has_a_layer():
    units = {_unit(m) for _, m in _modules()}
    assert units <= set(LAYERS), f"give these a layer in LAYERS: {sorted(units - set(LAYERS))}"


def test_no_import_runs_up_a_layer():
    bad = []
    for path, module in _modules():
        me = _unit(module)
        for target, line in _imports(path, module):
            other = _unit(target)
            if other in LAYERS and me in LAYERS and LAYERS[other] > LAYERS[me]:
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({me}, layer {LAYERS[me]}) imports {target} "
                           f"({other}, layer {LAYERS[other]})")
    assert not bad, "\n".join(bad)


def test_no_import_circle_between_modules():
    known = {m for _, m in _modules()}
    graph = {}
    for path, module in _modules():
        deps = set()
        for target, _ in _imports(path, module):
            while target and target not in known:  # from .x import name -> module .x
                target = target.rpartition(".")[0]
            if target and target != module and not module.startswith(target + "."):
                deps.add(target)  # a package importing its own submodules is no circle
        graph[module] = deps
    # depth-first search for a back edge, ignoring a package's own __init__ re-exports of
    # its submodules (they import the submodule, not the other way round)
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if m.startswith(d + ".") or d.startswith(m + "."):
                continue
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)
