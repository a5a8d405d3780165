"""docs/trl.md's pieces against TRL 1.16's own reward and advantage code on the same completions.

The page's ``my_agent`` rewards (``correctness``, declining rows without an answer; ``brevity``,
async, declining chat rows) and its ``Scratchpad`` environment score scripted episodes of the page's
rows through ``DatasetTasks`` (reset, a ``note`` call, the answer, the verdict, as the agent loop
drives them). TRL's ``_calculate_rewards`` and advantage lines (``trl_rewards_advantages.py``, run in
the TRL venv: ``TRL_PEER_PYTHON``) score the same completions with the same functions; the
environment's ``get_reward`` values enter TRL's code as the reward column TRL's own
``environment_factory`` wrapper appends (weight 1, ``None`` where it declines). Skipped without
the TRL venv."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.envs.datasets.test_tool_env import call
from tests.peers.test_trl_rewards_peer import PEER_PYTHON, ROOT
from tests.test_trl_doc import write_project
from thundersync_lightning.core import Objective
from thundersync_lightning.envs.datasets import DatasetTasks

# per row of the page's train.jsonl (0: math, answer 5; 1: chat, no answer): each trajectory's turns
SCRIPTS = {
    0: [[call("note", text="2+3=5"), "It is 5"], ["It is 4"], ["five"]],
    1: [["Hello"], ["Hi there"], [""]],
}


@pytest.mark.slow  # starts a second Python that imports TRL
@pytest.mark.skipif(not os.path.exists(PEER_PYTHON), reason=f"no TRL peer venv at {PEER_PYTHON}")
def test_the_pages_rewards_environment_and_advantages_equal_trls_own_code(tmp_path, monkeypatch) -> None:
    write_project(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_agent", raising=False)
    agent = importlib.import_module("my_agent")
    tasks = DatasetTasks(
        str(tmp_path / "train.jsonl"),
        tokenizer_path=str(tmp_path / "model"),
        tools=[agent.calculator],
        environment_factory=agent.Scratchpad,
        reward=[agent.correctness, agent.brevity],
        reward_weights=[1.0, 0.5],
        max_action_tokens=24,
        max_turns=2,
        template_kwargs={"enable_thinking": False},
    )
    r = tasks.renderer
    ours, spec_rows, completions = [], [], []
    for index, scripts in SCRIPTS.items():
        task = tasks.rows[index]
        for turns in scripts:
            env = tasks.make_env(task, 0)
            try:
                env.reset()
                for text in turns:
                    result = env.step((*r.tokenizer.encode(text, add_special_tokens=False), r.end_of_turn))
                    if result.done:
                        break
                verdict = env.verdict()
            finally:
                env.close()
            ours.append(verdict)
            parts = dict(verdict.parts)
            spec_rows.append({**task.row, "environment_reward": parts.get("Scratchpad")})
            completions.append([{"role": "assistant", "content": turns[-1]}])
    spec = {
        "reward_funcs": [
            "my_agent:correctness",
            "my_agent:brevity",
            "tests.peers.doc_environment_reward:scratchpad",
        ],
        "reward_weights": [1.0, 0.5, 1.0],
        "num_generations": 3,
        "scale_rewards": "group",
        "inputs": spec_rows,
        "prompts": [row["prompt"] for row in spec_rows],
        "completions": completions,
        "completion_ids": [[] for _ in spec_rows],
    }
    (tmp_path / "in.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.run(
        [PEER_PYTHON, str(ROOT / "tests/peers/trl_rewards_advantages.py"), "in.json", "out.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    trl = json.loads((tmp_path / "out.json").read_text())
    names = ("correctness", "brevity", "Scratchpad")
    assert tasks.reward_names == names
    assert [dict(v.parts).get("Scratchpad") for v in ours[:3]] == [1.0, 0.0, 0.0]  # the note was written once
    for k, value in enumerate(ours):
        expected = {n: x for n, x in zip(names, trl["rewards_per_func"][k]) if x is not None}
        assert dict(value.parts).keys() == expected.keys(), k
        assert all(abs(dict(value.parts)[n] - expected[n]) <= 1e-6 for n in expected), k
        assert value.unscorable == trl["unscorable"][k], k
        if not value.unscorable:
            assert abs(float(value) - trl["rewards"][k]) <= 1e-6 * max(1.0, abs(trl["rewards"][k])), k
    assert trl["unscorable"] == [False] * 3 + [True] * 3  # the chat row: every reward declined
    objective = Objective.preset("trl")  # TRL's advantages: GRPO over the scorable members, 0 for the others
    math_group = objective.advantages(
        torch.tensor([float(v) for v in ours[:3]], dtype=torch.float64)
    ).tolist()
    assert all(abs(a - b) <= 1e-5 for a, b in zip(trl["advantages"], math_group + [0.0] * 3)), trl[
        "advantages"
    ]
