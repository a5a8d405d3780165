"""Episode phase times of SWE-bench workspaces (envs/swebench/episodes.py) around a stand-in workspace."""

from __future__ import annotations

import pickle

import pytest

from thundersync_lightning.envs.repo.episode import CodeEnv
from thundersync_lightning.envs.repo.grading import EvalOutcome
from thundersync_lightning.envs.sandbox.base import SandboxResult
from thundersync_lightning.envs.swebench.episodes import EpisodeLog, TimedWorkspace, read_episodes


class FakeWorkspace:
    """Records the calls; ``evaluate`` resolves the patch "fix" only."""

    def __init__(self, fail_open: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_open = fail_open

    def open(self) -> None:
        self.calls.append("open")
        if self.fail_open:
            raise RuntimeError("image missing")

    def run(self, command, *, stdin=None, timeout_s=None):
        self.calls.append(f"run {command}")
        return SandboxResult(0, b"ok\n", False, False)

    def diff(self):
        self.calls.append("diff")
        return "fix"

    def evaluate(self, patch):
        self.calls.append("evaluate")
        status = {
            "FAIL_TO_PASS": {"success": ["a"], "failure": []},
            "PASS_TO_PASS": {"success": ["b", "c"], "failure": []},
        }
        return EvalOutcome(patch == "fix", "resolved", {"tests_status": status})

    def protects(self, path):
        return path.startswith("tests/")

    def close(self):
        self.calls.append("close")


def test_an_episode_writes_one_line_with_its_phases_reward_and_test_counts(tmp_path):
    path = str(tmp_path / "run" / "episodes.jsonl")
    inner = FakeWorkspace()
    env = CodeEnv(TimedWorkspace(inner, EpisodeLog(path), "lib__lib-1", seed=7), "fix it")
    env.reset()
    env.step(env.codec.encode("bash ls") + (env.codec.end_of_action,))
    env.step(env.codec.encode("bash pwd") + (env.codec.end_of_action,))
    assert env.verdict() == 1.0
    env.close()
    env.close()
    (rec,) = read_episodes(path)
    assert inner.calls == ["open", "run ls", "run pwd", "diff", "evaluate", "close"]
    assert rec["instance_id"] == "lib__lib-1" and rec["seed"] == 7 and rec["commands"] == 2
    assert rec["reward"] == 1.0 and rec["resolved"] is True and rec["verdict"] == "resolved"
    assert rec["tests"] == {
        "FAIL_TO_PASS": {"success": 1, "failure": 0},
        "PASS_TO_PASS": {"success": 2, "failure": 0},
    }
    assert rec["error"] is None
    for key in ("container_start_s", "commands_s", "verdict_s"):
        assert 0.0 <= rec[key] <= rec["episode_s"]
    assert TimedWorkspace(inner, EpisodeLog(path), "x", 0).protects("tests/a.py")  # the inner workspace's


def test_an_episode_whose_container_never_started_is_logged_with_the_error_and_no_reward(tmp_path):
    path = str(tmp_path / "episodes.jsonl")
    timed = TimedWorkspace(FakeWorkspace(fail_open=True), EpisodeLog(path), "lib__lib-2", seed=1)
    with pytest.raises(RuntimeError):
        timed.open()
    timed.close()
    (rec,) = read_episodes(path)
    assert (
        rec["reward"] is None
        and rec["verdict"] is None
        and rec["error"] == "open: RuntimeError: image missing"
    )


def test_an_unwritable_episode_log_never_fails_the_episode(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = pickle.loads(pickle.dumps(EpisodeLog(str(blocker / "episodes.jsonl"))))  # a directory under a file
    timed = TimedWorkspace(FakeWorkspace(), log, "lib__lib-3", seed=0)
    timed.open()
    timed.close()
