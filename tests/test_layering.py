"""Imports run down the layers only (docs/architecture.md): layers -> models -> experiments -> trainer
-> commands, and no module imports itself through others (a cycle); read from the source with ast (every
import, a function's lazy ones too)."""

import ast
import pathlib

from conftest import REPO

# Each package or module of lm/ and experiments/ and its layer, lowest first: a module may import its own
# layer or one below, never one above. The trainer's contract with the experiments (lm.train.experiment,
# lm.train.options) sits below them, the trainer itself above; so do the zero-shot tasks' scoring and their
# evaluators (lm.eval.benchmarks, which the language model adds), the rest of lm.eval above; the sweep files and
# the analyses of trained runs sit with the commands. A new top-level module must be placed here.
LAYERS = (
    ("lm.errors", "lm.cpu", "lm.runs", "lm.distributed", "lm.plots", "lm.task_metrics", "lm.losses",
     "lm.sharding", "lm.progress", "lm.console", "lm.scaling", "lm.launch", "lm.rewards",
     "lm.xla_flags"),
    ("lm.layers", "lm.data"),
    ("lm.models",),
    ("lm.decode", "lm.hf", "lm.eval.scoring", "lm.eval.tasks", "lm.eval.passkey", "lm.eval.report"),
    ("lm.train.experiment", "lm.train.options", "lm.eval.benchmarks"),
    ("experiments",),
    ("lm.train", "lm.eval"),
    ("lm.cli", "lm.__main__", "experiments.studies", "experiments.analysis"),
)


def layer(module: str) -> int:
    """The layer of module: that of the longest name in LAYERS it is or is under (lm.train.loop: lm.train's);
    lm itself, the package, counts as the lowest."""
    if module == "lm":
        return 0
    matches = [(len(name), index) for index, names in enumerate(LAYERS) for name in names
               if module == name or module.startswith(name + ".")]
    assert matches, f"{module} is in no layer of tests/test_layering.py's LAYERS: place it there"
    return max(matches)[1]


def project_modules() -> dict[str, pathlib.Path]:
    """Every module of lm/ and experiments/ (the studies' sweep files too), by dotted name."""
    modules = {}
    for path in [*REPO.glob("lm/**/*.py"), *REPO.glob("experiments/**/*.py")]:
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    return modules


def imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The project modules path imports (`from lm import sharding` imports lm.sharding)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return {name for name in found if name.split(".")[0] in ("lm", "experiments")}


def test_imports_run_down_the_layers_and_lm_never_imports_experiments():
    modules = project_modules()
    assert "lm.train.loop" in modules and "experiments.language_model" in modules
    upward = []
    for name, path in sorted(modules.items()):
        for imported in sorted(imports(path, modules)):
            into_experiments = name.startswith("lm") and imported.split(".")[0] == "experiments"
            if into_experiments or layer(imported) > layer(name):
                upward.append(f"{name} -> {imported}")
    assert not upward, upward


def test_the_layering_check_sees_an_upward_import(tmp_path):
    """The check itself: a lazy import of the trainer from a layer module is found."""
    path = tmp_path / "module.py"
    path.write_text("def f():\n    from lm.train.setup import build\n    import experiments.translation\n")
    modules = project_modules()
    assert imports(path, modules) == {"lm.train.setup", "experiments.translation"}
    assert layer("lm.train.setup") > layer("experiments.translation") > layer("lm.train.experiment")


def module_graph() -> dict[str, set[str]]:
    """Each module of lm/ and experiments/ -> the modules of them it imports."""
    modules = project_modules()
    return {name: {m for m in imports(path, modules) if m in modules and m != name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as [a, b, ..., a], or []."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = "done"
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return []


def test_no_import_cycle_among_the_modules():
    graph = module_graph()
    assert {"lm.train.loop", "lm.train.setup", "lm.runs"} <= graph["lm.train.loop"] | {"lm.train.loop"}
    assert find_cycle(graph) == []


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
