"""The step path reads no objective field: it asks the core's scoring and accumulator API.

The runner's modules and the strategy's step hooks (set-up checks aside) must not read
``objective.<field>`` nor ``<x>.objective``: every option is applied by the core
(``core/scoring.py``, the accumulator), so an objective option never touches ``strategy/``. Nor do
they keep their own copies of what the accumulator answers for (dropped members, owners and
members of groups, whether a group is informative).
"""

from __future__ import annotations

import ast
from pathlib import Path

STRATEGY = Path(__file__).resolve().parents[2] / "src" / "thundersync_lightning" / "strategy"
STEP_MODULES = ("runner.py", "intake.py", "replacement.py", "records.py", "batching.py", "barrier.py")
STEP_HOOKS = ("training_step", "validation_step", "backward", "optimizer_step", "_frozen_policy")


def _objective_reads(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr == "objective" or (isinstance(node.value, ast.Name) and node.value.id == "objective"):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_runner_and_the_step_hooks_read_no_objective_field():
    reads = {}
    for name in STEP_MODULES:
        reads[name] = _objective_reads(ast.parse((STRATEGY / name).read_text()))
    strategy = ast.parse((STRATEGY / "strategy.py").read_text())
    hooks = [n for n in ast.walk(strategy) if isinstance(n, ast.FunctionDef) and n.name in STEP_HOOKS]
    assert {h.name for h in hooks} == set(STEP_HOOKS)
    for hook in hooks:
        reads[f"strategy.py:{hook.name}"] = _objective_reads(hook)
    assert {k: v for k, v in reads.items() if v} == {}


def test_the_check_sees_an_objective_read():
    assert _objective_reads(ast.parse("x = self.acc.objective.failed")) != []
    assert _objective_reads(ast.parse("x = objective.kl_coef")) != []
    assert _objective_reads(ast.parse("x = objective_terms(a, b)")) == []


def test_the_runner_keeps_no_copy_of_what_the_accumulator_answers():
    text = "".join((STRATEGY / name).read_text() for name in ("runner.py", "intake.py", "replacement.py"))
    for name in ("_is_dropped", "self._owner", "self._members", "import informative", " informative("):
        assert name not in text, name
