"""Our rewards against TRL 1.16's own ``_calculate_rewards`` and advantage lines on the same
completions (``trl_rewards_advantages.py``, run in a venv with TRL: ``TRL_PEER_PYTHON``, default
``.venv-trl/bin/python``, which ``make test-peers`` builds; skipped where there is none).

TRL computes in float32: values are compared to 1e-6 relative. The advantages of a group with an
unscorable member are TRL's: that member 0, the others from the scorable members' mean and std."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from thundersync_lightning.core import Objective
from thundersync_lightning.envs.datasets import RewardInput, RewardSum

ROOT = Path(__file__).resolve().parents[2]
PEER_PYTHON = os.environ.get(
    "TRL_PEER_PYTHON", str(Path(__file__).resolve().parents[2] / ".venv-trl" / "bin" / "python")
)
FUNCS = [
    "tests.envs.peer_rewards:format_if_answer",
    "tests.envs.peer_rewards:correctness",
    "tests.envs.peer_rewards:async_length",
    "tests.envs.peer_rewards:declines",
]
WEIGHTS = [0.5, 2.0, 1.0, 3.0]
CHAT = [{"role": "user", "content": "What is 2 + 3?"}]
# three groups of three: a conversational prompt scored by all; a plain one without an answer whose empty
# completion every reward declines (unscorable, its group mates scored by length alone); one all unscorable
GROUPS = [
    (CHAT, 5, ["It is 5", "It is 4", "five"], [[1, 2, 3], [4], [5, 6]]),
    ("What is 1 + 1?", None, ["2", "two", ""], [[1], [2, 2, 2], []]),
    ("Say nothing.", None, ["", "", ""], [[], [], []]),
]


def peer_spec():  # noqa: ANN201
    inputs, prompts, completions, ids = [], [], [], []
    for prompt, answer, texts, token_ids in GROUPS:
        for text, tok in zip(texts, token_ids):
            inputs.append({"prompt": prompt, "answer": answer})
            prompts.append(prompt)
            completions.append([{"role": "assistant", "content": text}] if isinstance(prompt, list) else text)
            ids.append(tok)
    return {
        "reward_funcs": FUNCS,
        "reward_weights": WEIGHTS,
        "num_generations": 3,
        "scale_rewards": "group",
        "inputs": inputs,
        "prompts": prompts,
        "completions": completions,
        "completion_ids": ids,
    }


@pytest.mark.slow  # starts a second Python that imports TRL
@pytest.mark.skipif(not os.path.exists(PEER_PYTHON), reason=f"no TRL peer venv at {PEER_PYTHON}")
def test_rewards_and_unscorable_flags_equal_trls_own_code_on_the_same_completions(tmp_path) -> None:
    spec = peer_spec()
    (tmp_path / "in.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
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
    assert trl["trl_version"] == "1.16.0"
    rewards = RewardSum(FUNCS, WEIGHTS)
    ours = [
        rewards.score(
            RewardInput(p, c[0]["content"] if isinstance(c, list) else c, row, completion_ids=tuple(i))
        )
        for p, c, row, i in zip(spec["prompts"], spec["completions"], spec["inputs"], spec["completion_ids"])
    ]
    for k, (value, theirs) in enumerate(zip(ours, trl["rewards_per_func"])):
        given = dict(value.parts)
        expected = {n: r for n, r in zip(rewards.names, theirs) if r is not None}  # TRL's NaN: declined
        assert given.keys() == expected.keys(), k
        assert all(abs(given[n] - expected[n]) <= 1e-6 * max(1.0, abs(expected[n])) for n in given), k
        assert value.unscorable == trl["unscorable"][k]
        if not value.unscorable:
            assert abs(float(value) - trl["rewards"][k]) <= 1e-6 * max(1.0, abs(trl["rewards"][k])), k
    # TRL's advantages: GRPO over each group's scorable members (sample std, eps 1e-4), 0 when unscorable
    objective = Objective.preset("trl")
    assert [sum(trl["unscorable"][3 * g : 3 * g + 3]) for g in range(3)] == [
        0,
        1,
        3,
    ]  # the data does what it says
    for g in range(len(GROUPS)):
        members = range(3 * g, 3 * g + 3)
        scorable = [k for k in members if not ours[k].unscorable]
        expected = dict.fromkeys(members, 0.0)
        if len(scorable) > 1:
            a = objective.advantages(torch.tensor([float(ours[k]) for k in scorable], dtype=torch.float64))
            expected.update(zip(scorable, a.tolist()))
        assert all(abs(trl["advantages"][k] - expected[k]) <= 1e-5 for k in members), (g, trl["advantages"])
