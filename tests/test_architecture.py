"""The package's layers: no module imports from a layer above its own, and no import circle.

Layers, lowest first (docs/ARCHITECTURE.md):

* the **engine**, shared by every model: errors, helpers and validated settings (``specs``) ->
  data, graph, penalties, metrics, diagnostics -> checkpoint, exchange -> consensus, the run driver
  (``driver``: every model's iteration loop, checkpoints and resume), the model-free multi-process engine
  (``distributed``: transport, launcher, partition, costs, Paillier parties) and the privacy
  audit's recordings and attacks (``audit``);
* the **models** (``models.<name>``, each with its solver, API, estimator, experiments, and
  its runs over ranks and audit scenarios): each imports the engine only, never another
  model or the app;
* the **app** (``app``): CLI, runner, tasks, outputs, loggers, TensorBoard, the app over
  ranks; then the entry points (``__main__``, ``distributed.__main__``, ``__init__``).

Imports inside functions count too (a lazy import is still a dependency). A unit is a model's
package (``models.<name>``, at the models' layer) or the longest dotted name of :data:`LAYERS`
that a module's name starts with (``app``, ``distributed``, ``distributed.__main__``).
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ppdnmf_torch"

#: the engine's units (shared by every model; never import a model or the app)
ENGINE = {
    "errors": 0, "_utils": 0, "threads": 0, "folderlock": 0, "specs": 0, "budget": 0,
    "data": 1, "graph": 1, "penalties": 1, "metrics": 1, "diagnostics": 1,
    "checkpoint": 2, "exchange": 2,
    "consensus": 3, "driver": 3,
    "distributed": 3, "audit": 3,
}

#: unit -> layer; a module may import only from its own layer or below, and within a layer
#: only without a circle
LAYERS = {
    **ENGINE,
    # the models' packages (each imports the engine below it, never another model or the app)
    "models": 4,
    # the app
    "app": 5,
    # entry points
    "distributed.__main__": 6, "__main__": 6, "__init__": 6,
}


def _unit(module: str) -> str:
    """``ppdnmf_torch.models.ppdnmf.solver.admm`` -> ``models.ppdnmf``; ``ppdnmf_torch.app.cli`` ->
    ``app``; ``ppdnmf_torch.distributed.comm`` -> ``distributed.comm``."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] == "models" and len(parts) > 1:
        return f"models.{parts[1]}"  # every model's package is a unit of its own, at the models' layer
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in LAYERS:
            return name
    return parts[0]


@functools.lru_cache(maxsize=None)
def _imports(path: Path, module: str) -> tuple:
    """``(target, line)`` of every import of ``module`` (parsed once per test session)."""
    return tuple(_walk_imports(path, module))


def _walk_imports(path: Path, module: str):
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


def _layer(unit: str):
    """The unit's layer: its own entry of :data:`LAYERS`, or its package's (``models.<name>``)."""
    return LAYERS.get(unit, LAYERS.get(unit.split(".")[0]) if unit.startswith("models.") else None)


def test_every_unit_has_a_layer():
    units = {_unit(m) for _, m in _modules()}
    missing = sorted(u for u in units if _layer(u) is None)
    assert not missing, f"give these a layer in LAYERS: {missing}"


def test_no_import_runs_up_a_layer():
    bad = []
    for path, module in _modules():
        me = _unit(module)
        for target, line in _imports(path, module):
            other = _unit(target)
            if _layer(other) is not None and _layer(me) is not None and _layer(other) > _layer(me):
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({me}, layer {_layer(me)}) imports {target} "
                           f"({other}, layer {_layer(other)})")
    assert not bad, "\n".join(bad)


def _model_of(unit: str):
    return unit.split(".")[1] if unit.startswith("models.") else None


def test_models_import_only_the_engine():
    """A model package imports the engine and itself: never another model, never the app."""
    bad = []
    for path, module in _modules():
        me = _unit(module)
        if _model_of(me) is None:
            continue
        for target, line in _imports(path, module):
            other = _unit(target)
            if other in ENGINE or other == me or other == "models":
                continue
            bad.append(f"{path.relative_to(PKG.parent)}:{line} (model {_model_of(me)}) imports {target}")
    assert not bad, "\n".join(bad)


def test_engine_imports_no_model_and_no_app():
    bad = []
    for path, module in _modules():
        if _unit(module) not in ENGINE:
            continue
        for target, line in _imports(path, module):
            other = _unit(target)
            if other.startswith("models") or other == "app":
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({_unit(module)}, engine) imports {target}")
    assert not bad, "\n".join(bad)


def test_every_model_has_a_task():
    """Each model package comes with its app task (``app/tasks/<name>.py``) and its
    ``conf/task/<name>.yaml``."""
    models = sorted(p.name for p in (PKG / "models").iterdir() if (p / "__init__.py").is_file())
    assert "ppdnmf" in models
    for name in models:
        assert (PKG / "app" / "tasks" / f"{name}.py").is_file(), f"models/{name} has no app/tasks/{name}.py"
        assert (PKG.parent / "conf" / "task" / f"{name}.yaml").is_file(), f"models/{name} has no conf/task/{name}.yaml"


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


def test_units_of_the_layout():
    """Every model is a unit of its own at the models' layer (one added later too), so the rules
    above hold between models; the app is one unit; entry points sit on top."""
    assert _unit("ppdnmf_torch.models.ppdnmf.solver.admm") == "models.ppdnmf"
    assert _unit("ppdnmf_torch.models.symnmf.api") == "models.symnmf"
    assert _layer("models.symnmf") == _layer("models.ppdnmf") == LAYERS["models"]
    assert _model_of("models.symnmf") == "symnmf" and _model_of("models") is None
    assert _unit("ppdnmf_torch.app.tasks.ppdnmf") == "app" and _unit("ppdnmf_torch.exchange.paillier.keys") == "exchange"
    assert _unit("ppdnmf_torch.distributed.comm") == "distributed"
    assert _layer(_unit("ppdnmf_torch.distributed.__main__")) > _layer("app") > _layer("models.ppdnmf")
    assert max(ENGINE.values()) < _layer("models.ppdnmf")


#: imports of another module's private name that must stay, and why
PRIVATE_ALLOWED = {
    ("ppdnmf_torch.distributed.parties", "_Agent"):
        "the Paillier key holder (its private key and mask seeds never leave it) is private to "
        "exchange.paillier by design; a rank's parties are the one other place that makes them",
}
#: private names still imported: to keep empty
PRIVATE_PENDING: dict = {}


def _private_imports():
    """``(module, name, line)`` of every ``from x import _name`` of a name (not a module: a
    package's own private module, such as ``app/tasks/_common``, is its package's to share)."""
    known = {m for _, m in _modules()}
    for path, module in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        pkg = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{target}.{alias.name}" not in known:
                    yield module, alias.name, node.lineno


def test_no_module_imports_another_modules_private_name():
    bad = [f"{m}:{line} imports {name}" for m, name, line in _private_imports()
           if (m, name) not in PRIVATE_ALLOWED and name not in PRIVATE_PENDING.get(m, ())]
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------- less to read
MAX_MODULE_LINES = 600
#: a function's lines, its docstring left out (an entry point's numpydoc is its users' manual)
MAX_FUNCTION_LINES = 120
#: parameters of a function inside the package: the internals pass a spec or a few small
#: dataclasses (PPDNMF's: models/ppdnmf/config.SolverConfig, FitOptions)
MAX_PARAMETERS = 19
#: the public entry points keep scikit-learn-style explicit keywords (their defaults are their spec's)
ENTRY_POINTS = {"models.ppdnmf.api.fit", "models.ppdnmf.api.fit_trials", "models.ppdnmf.distributed.engine.fit_rank",
                "models.ppdnmf.estimator.PPDNMF.__init__", "models.ppdnmf.audit.run.run_audit",
                "models.symnmf.agents.fit_symnmf_agents", "models.symnmf.distributed.fit_symnmf_rank",
                "models.fsspca.fit.fit_fsspca", "models.fsspca.serverless.fit_serverless",
                "models.fsspca.estimator.FederatedSparsePCA.__init__"}
#: over a limit, to empty
SIZE_PENDING: set = set()


def _functions(tree, prefix=""):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def test_modules_and_functions_are_short():
    bad = []
    for path, module in _modules():
        name = module.removeprefix("ppdnmf_torch.")
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES and name not in SIZE_PENDING:
            bad.append(f"{name}: {len(text.splitlines())} lines")
        for qual, node in _functions(ast.parse(text)):
            full = f"{name}.{qual}"
            body = node.body
            doc = (body[0].end_lineno - body[0].lineno + 1 if body and isinstance(body[0], ast.Expr)
                   and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str) else 0)
            lines = node.end_lineno - node.lineno + 1 - doc
            a = node.args
            n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
            if lines > MAX_FUNCTION_LINES and full not in SIZE_PENDING:
                bad.append(f"{full}: {lines} lines")
            if n > MAX_PARAMETERS and full not in ENTRY_POINTS | SIZE_PENDING:
                bad.append(f"{full}: {n} parameters")
    assert not bad, "\n".join(bad)
