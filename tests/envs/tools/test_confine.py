"""The user's tools and rewards run confined and apart: the calculator's ``eval`` escape reaches no
host uid, file, network or memory beyond its limits; one episode's tool calls never change what
another episode's tools or any reward run; where bubblewrap cannot run the fallback is never silent."""

from __future__ import annotations

import logging
import os
import socket
import threading

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.envs.datasets import DatasetTasks
from thundersync_lightning.envs.sandbox.bwrap import bwrap_available
from thundersync_lightning.envs.tools import ToolWorkers, WorkerLimits
from thundersync_lightning.envs.tools import confine as confine_module
from thundersync_lightning.envs.tools.confine import confinement

from ..datasets.test_tool_env import call, tokenizer_dir

needs_bwrap = pytest.mark.skipif(
    not bwrap_available(), reason="bubblewrap and root are needed to confine workers"
)

# docs/custom.md's calculator before this change: eval without builtins
CALCULATOR = '''
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. 2 * (3 + 4)
    """
    return str(eval(expression, {"__builtins__": {}}))
'''

# what a call in one episode may do to the user's module, and what another episode reads of it
MODULE_STATE = '''
NOTES = []


def tamper(note: str) -> str:
    """Rewrite this module: the reward and a list the tools read.

    Args:
        note: kept in NOTES
    """
    import agent_module
    agent_module.correct.__code__ = (lambda prompt, completion, **row: 1.0).__code__
    NOTES.append(note)
    return "done"


def notes() -> str:
    """What NOTES holds."""
    return ",".join(NOTES) or "none"


def correct(prompt, completion, answer, **row):
    return float(str(answer) in completion)
'''

# reaches os.popen from eval without builtins, through object's subclasses
POPEN = (
    "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
    ".__init__.__globals__['popen']"
)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    (tmp_path / "calc_tools.py").write_text(CALCULATOR)
    (tmp_path / "agent_module.py").write_text(MODULE_STATE)
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    secret.chmod(0o600)
    tmp_path.chmod(0o755)  # the modules' directory is readable by others; the secret is not
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path


def calculate(workers: ToolWorkers, expression: str) -> str:
    outcome = workers.call("calc_tools:calculator", {"expression": expression}, timeout_s=30.0)
    return outcome.text if outcome.error is None else f"[error] {outcome.error}"


@needs_bwrap
def test_the_calculator_escape_runs_as_its_own_uid_without_host_files_network_or_memory(
    user_dir, monkeypatch
) -> None:
    monkeypatch.syspath_prepend(
        "/"
    )  # a top-level directory on sys.path is not bound (it would show the host)
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen(1)
    host.setblocking(False)
    port = host.getsockname()[1]
    workers = ToolWorkers(max_idle=1)  # one worker serves every probe (started once)
    try:
        uid = int(calculate(workers, f"{POPEN}('id -u').read()"))
        assert uid != os.geteuid() and WorkerLimits().uid_base <= uid < WorkerLimits().uid_base + 512
        secret = calculate(workers, f"{POPEN}('cat {user_dir}/secret.txt 2>&1').read()")
        assert "host secret" not in secret and "Permission denied" in secret
        assert "No such file" in calculate(workers, f"{POPEN}('cat /etc/passwd 2>&1').read()")  # not bound
        assert calculate(workers, f"{POPEN}('ls {user_dir.parent}').read()").split() == [user_dir.name]
        assert sorted(calculate(workers, f"{POPEN}('env').read()").split()) == [  # sh adds PWD (and SHLVL)
            "HOME=/tmp",
            "LANG=C.UTF-8",
            "PATH=/usr/bin:/bin",
            "PWD=/tmp",
            "PYTHONDONTWRITEBYTECODE=1",
            "TMPDIR=/tmp",
        ]
        net = calculate(
            workers, f"{POPEN}('bash -c \"echo x > /dev/tcp/127.0.0.1/{port}\" 2>&1; echo rc=$?').read()"
        )
        assert "Connection refused" in net and "rc=1" in net  # its own network namespace's loopback
        with pytest.raises(BlockingIOError):
            host.accept()  # nothing reached the host's listener
        assert (
            calculate(workers, "('x' * (1536 * 1024**2)).__len__()")
            == "[error] calculator raised MemoryError"
        )
        assert calculate(workers, "6 * 7") == "42"  # the worker lives on after each refusal
    finally:
        workers.close()
        host.close()


def test_a_plain_worker_still_has_an_empty_environment_and_a_memory_cap(user_dir) -> None:
    workers = ToolWorkers(max_idle=1, limits=WorkerLimits(sandbox="rlimits"))
    try:
        assert (
            calculate(workers, "('x' * (1536 * 1024**2)).__len__()")
            == "[error] calculator raised MemoryError"
        )
        env = calculate(workers, f"{POPEN}('env').read()").split()
        assert "HOME=/tmp" in env and not [e for e in env if e.startswith(("PYTHONPATH=", "WANDB", "HF_"))]
    finally:
        workers.close()


def agent_tasks() -> DatasetTasks:
    return DatasetTasks(
        [{"prompt": "What is 2 + 3?", "answer": "5"}],
        fields={"answer": "answer"},
        reward="agent_module:correct",
        tokenizer_path=tokenizer_dir(),
        tools=["agent_module:tamper", "agent_module:notes"],
        tool_timeout_s=30.0,
        max_turns=3,
    )


def run_turn(tasks: DatasetTasks, env, text: str):  # noqa: ANN001, ANN201
    r = tasks.renderer
    return env.step((*r.tokenizer.encode(text, add_special_tokens=False), r.end_of_turn))


def test_one_episodes_tool_call_changes_no_other_episodes_tools_and_no_reward(user_dir) -> None:
    tasks = agent_tasks()
    a, b = (tasks.make_env(tasks.rows[0], 0) for _ in range(2))
    a.reset()
    b.reset()
    decode = tasks.renderer.tokenizer.decode
    assert "done" in decode(run_turn(tasks, a, call("tamper", note="from-a")).observation)
    assert "from-a" in decode(run_turn(tasks, a, call("notes")).observation)  # its own episode sees it
    assert "none" in decode(run_turn(tasks, b, call("notes")).observation)  # another episode does not
    for env in (a, b):
        assert run_turn(tasks, env, "It is 7.").done
        assert env.verdict() == 0.0  # the reward a tool call rewrote still grades the wrong answer 0
    a.close()
    b.close()


def test_a_closed_episodes_worker_is_gone_with_its_groups_and_uid_and_its_tools_refuse_calls(
    user_dir,
) -> None:
    tasks = agent_tasks()
    env = tasks.make_env(tasks.rows[0], 0)
    env.reset()
    run_turn(tasks, env, call("notes"))
    (worker,) = env.workers._workers.values()
    groups = list(worker.cgroup.dirs) if worker.cgroup is not None else []
    with open(f"/proc/{worker.proc.pid}/cgroup") as f:
        own = f.read()
    assert all(os.path.basename(d) in own for d in groups)  # the worker is in groups of its own
    env.close()
    assert worker.proc.poll() is not None and not any(os.path.exists(d) for d in groups)
    assert worker.lease is None or not worker.lease.held  # its uid is free again
    outcome = env.workers.call("agent_module:notes", {}, timeout_s=30.0)
    assert outcome.error == "notes: not run, its episode's tools were closed"


def test_a_host_that_cannot_confine_warns_or_with_require_sandbox_refuses(monkeypatch, caplog) -> None:
    monkeypatch.setattr(confine_module, "bwrap_available", lambda: False)
    monkeypatch.setattr(confine_module, "_warned", set())
    with caplog.at_level(logging.WARNING):
        assert confinement(WorkerLimits()) == "rlimits"
    assert "cannot be confined" in caplog.text and "require_sandbox" in caplog.text
    with pytest.raises(ConfigError, match="cannot be confined"):
        confinement(WorkerLimits(require_sandbox=True))
    assert confinement(WorkerLimits(sandbox="rlimits")) == "rlimits"


def test_worker_limits_come_from_a_mapping_and_every_bad_field_is_named() -> None:
    assert WorkerLimits.of({"memory_bytes": 2**31, "sandbox": "rlimits"}) == WorkerLimits(
        memory_bytes=2**31, sandbox="rlimits"
    )
    with pytest.raises(ConfigError, match=r"unknown keys \['memory'\]"):
        WorkerLimits.of({"memory": 1})
    with pytest.raises(ConfigError) as err:
        WorkerLimits(nproc=0, sandbox="docker")
    assert "nproc=0 must be > 0" in str(err.value) and "sandbox='docker'" in str(err.value)


def test_a_sources_worker_limits_confine_its_rewards_too() -> None:
    rows = [{"prompt": "p", "answer": "5"}]
    tight = DatasetTasks(
        rows, reward="tests.envs.user_rewards:hungry", worker_limits={"memory_bytes": 512 * 1024**2}
    )
    failed = tight.reward_sum("p", "c", tight.rows[0].row)  # a reward's failure is the verdict's (issue 50)
    assert failed == 0.0 and "MemoryError" in failed.failure
    roomy = DatasetTasks(rows, reward="tests.envs.user_rewards:hungry")
    assert roomy.reward_sum("p", "c", roomy.rows[0].row) == 1.0


def test_closing_an_episode_ends_its_running_tool_call_at_once(user_dir) -> None:
    (user_dir / "slow_tools.py").write_text("import time\n\ndef wait():\n    time.sleep(3600)\n")
    workers = ToolWorkers(max_idle=1)
    taken = threading.Event()
    take = workers._take

    def take_and_tell(paths):  # noqa: ANN001, ANN202
        worker = take(paths)
        taken.set()
        return worker

    workers._take = take_and_tell
    outcome = []
    caller = threading.Thread(
        target=lambda: outcome.append(workers.call("slow_tools:wait", {}, timeout_s=600.0))
    )
    caller.start()
    assert taken.wait(60)
    workers.close()  # the episode ends while its call runs
    caller.join(60)
    assert not caller.is_alive() and outcome[0].error is not None and not outcome[0].timed_out
