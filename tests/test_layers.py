"""The package's layering: lower layers never import higher ones; the core never imports Lightning."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "thundersync_lightning"

# layer of each top-level part of the package (see docs/design.md)
LAYERS = {
    "core": 0,
    "planning": 1,
    "backends": 1,
    "strategy": 2,
    "rollout": 3,
    "envs": 3,
    "modules": 4,
    "callbacks": 5,
    "summary": 5,
    "show": 6,
    "cli": 6,
    "cli_errors": 6,
    "verify": 6,
    "export": 6,
}


def _part(module_path: Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks (annotations only:
    they never run, so they are no import at run time). Function-local imports are included."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return [n for n in ast.walk(tree) if id(n) not in skip]


def _imports(path: Path) -> set[str]:
    """Absolute names of the package's own modules and of third-party packages that ``path`` imports
    when it runs (at import time or inside a function); ``from pkg import name`` also counts the
    module ``pkg.name`` when there is one."""
    tree = ast.parse(path.read_text())
    package_parts = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module:
                module = node.module
            else:
                continue
            found.add(module)
            found.update(
                f"{module}.{alias.name}" for alias in node.names if _is_module(f"{module}.{alias.name}")
            )
    return found


def _module_path(name: str) -> Path | None:
    """The file of one of the package's own modules, or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE.name:
        return None
    base = PACKAGE.parent.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_module(name: str) -> bool:
    return _module_path(name) is not None


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's own modules it imports at run time (function-local imports included)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        graph[_module_name(path)] = {n for n in _imports(path) if _is_module(n) and n != _module_name(path)}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_a_higher_layer():
    violations = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent == PACKAGE and path.name == "__init__.py":
            continue  # the package root re-exports (and registers the strategy)
        own = LAYERS[_part(path)]
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "thundersync_lightning" or len(parts) < 2 or parts[1] not in LAYERS:
                continue
            if LAYERS[parts[1]] > own:
                violations.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert violations == []


def test_the_core_works_where_lightning_is_not_installed():
    code = (
        "import sys; sys.modules['lightning'] = None\n"
        "import torch\n"
        "from thundersync_lightning.core import StreamingGRPO\n"
        "w = torch.ones(2, requires_grad=True)\n"
        "acc = StreamingGRPO([w]); acc.open_group('g', ['a', 'b'])\n"
        "acc.add_reward('a', 1.0); acc.add_reward('b', 0.0)\n"
        "acc.add_logprob('a', (w * 2).sum()); acc.add_logprob('b', w.sum())\n"
        "acc.finish(); print(w.grad.tolist())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # rewards (1, 0): mu = 0.5, sigma = 0.5, A = (+0.5, -0.5) / (0.5 + eps);
    # grad L = -(1/N) (A_a * 2 + A_b * 1) per element, N = 1
    advantage = 0.5 / (0.5 + 1e-6)
    expected = -(advantage * 2.0 - advantage * 1.0)
    assert [round(v, 6) for v in eval(out.stdout)] == [round(expected, 6)] * 2


def test_no_two_modules_import_each_other_even_inside_a_function():
    graph = import_graph()
    # packages re-export their modules: an edge into a package's __init__ stands for its re-exports,
    # which is a cycle only when the package imports the importer back; keep __init__s out of it
    inits = {
        name for name in graph if _module_path(name) is not None and _module_path(name).name == "__init__.py"
    }
    graph = {v: {w for w in ws if w not in inits} for v, ws in graph.items() if v not in inits}
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_function_local_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_data_module_and_the_policy_import_nothing_from_the_strategy():
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in (PACKAGE / "modules").rglob("*.py")
        for name in _imports(path)
        if name.startswith(f"{PACKAGE.name}.strategy")
    ]
    assert offenders == []


def test_the_backward_backends_import_nothing_above_the_core():
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in (PACKAGE / "backends").rglob("*.py")
        for name in _imports(path)
        if name.startswith(f"{PACKAGE.name}.") and name.split(".")[1] not in ("core", "backends")
    ]
    assert offenders == []


def test_the_accumulator_the_runner_and_the_policy_meet_no_split_concept():
    # they talk to a backward backend (core/gradients/backward.py); the split backward lives in backends/split
    words = r"\b(?:split\w*|capture|factors?|row_grads|hold_room|max_destinations|backends)\b|\bmix="
    offenders = [
        f"{name}: {word}"
        for name in (
            "core/accumulator/streaming.py",
            "strategy/runner.py",
            "strategy/batching.py",
            "modules/policy.py",
        )
        for word in sorted(set(re.findall(words, (PACKAGE / name).read_text())))
    ]
    assert offenders == []


def test_the_core_and_the_planner_import_no_lightning():
    offenders = [
        str(path.relative_to(PACKAGE))
        for part in ("core", "planning", "backends")
        for path in (PACKAGE / part).rglob("*.py")
        if any(name.split(".")[0] in ("lightning", "pytorch_lightning") for name in _imports(path))
    ]
    assert offenders == []


ENVS = PACKAGE / "envs"
# a task family is a package of envs/ with a source.py (its TaskSource); every other module of envs/
# (its top-level modules, sandbox/, tools/, repo/) is the toolkit the families share
FAMILIES = sorted(p.name for p in ENVS.iterdir() if (p / "source.py").is_file())


def _family_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[:2] != [PACKAGE.name, "envs"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in FAMILIES else None


def test_no_task_family_imports_another_familys_package():
    assert {"code", "swebench", "mutations", "toy"} <= set(FAMILIES)  # the rule is not vacuous
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for family in FAMILIES
        for path in (ENVS / family).rglob("*.py")
        for name in _imports(path)
        if _family_of(name) not in (None, family)
    ]
    assert offenders == []


def test_the_envs_toolkit_imports_no_task_family():
    toolkit = [p for p in ENVS.rglob("*.py") if p.relative_to(ENVS).parts[0] not in FAMILIES]
    assert {"codec.py", "selection.py", "episode.py", "grading.py"} <= {p.name for p in toolkit}
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in toolkit
        for name in _imports(path)
        if _family_of(name) is not None
    ]
    assert offenders == []
