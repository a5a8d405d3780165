"""Run as a script (vLLM worker processes re-import it): engine-core restarts with worker processes on CPU.

Two 2-step streaming fits, one whose engine core is SIGKILLed in the middle of step 1's episodes
(before its second generation call of that step); then an engine with ``max_engine_restarts=0``
whose core is killed. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def kill_cores(pids: tuple[int, ...]) -> tuple[int, ...]:
    from tests.rollout.procs import gone, wait_until

    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: all(gone(p) for p in pids), deadline_s=30.0), "the engine core outlived SIGKILL"
    return pids


def fits() -> dict:
    import lightning as L

    from tests.rollout.vllm.tasks import TOY_VLLM_MODEL
    from tests.strategy._fit import fit, outcomes, relative
    from thundersync_lightning.envs.toy import GuessingGameTasks
    from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
    from thundersync_lightning.rollout import VLLMEngineConfig
    from thundersync_lightning.rollout.vllm.core import RestartingCore

    kill: dict = {"armed": False, "loads": 0, "calls": 0, "killed": (), "core": None}
    original_generate, original_load = RestartingCore.generate, RestartingCore.load

    def load(self: RestartingCore, weights, path=None):
        kill["loads"] += 1  # one per publish: version k is the (k+1)-th
        return original_load(self, weights, path)

    def generate(self: RestartingCore, requests):
        kill["core"] = self
        if kill["armed"] and kill["loads"] == 2 and not kill["killed"]:
            kill["calls"] += 1
            if kill["calls"] == 2:  # mid-step: some episodes of step 1 have acted once
                kill["killed"] = kill_cores(self.pids)
        return original_generate(self, requests)

    RestartingCore.generate, RestartingCore.load = generate, load  # type: ignore[method-assign]

    def run(crash: bool):
        kill["armed"], kill["loads"] = crash, 0
        L.seed_everything(0)  # the policy's initial weights
        engine = VLLMEngineConfig(
            temperature=1.0,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=64,
            env_workers=4,
            multiprocessing=True,
        )
        data = RolloutDataModule(
            tasks=GuessingGameTasks(latency="none"), engine=engine, group_size=4, groups_per_step=3, seed=0
        )
        policy = GRPOPolicy(config=TOY_VLLM_MODEL)
        params, steps, _ = fit("streaming", steps=2, policy=policy, data=data)
        return params, steps, kill["core"]

    plain, plain_steps, plain_core = run(crash=False)
    crashed, crashed_steps, crashed_core = run(crash=True)
    return {
        "killed": kill["killed"],
        "calls": kill["calls"],
        "restarts_plain": plain_core.restart_count,
        "restarts_crashed": crashed_core.restart_count,
        "steps": [len(s.trajectories) for s in crashed_steps],
        "same_outcomes": [outcomes(a) == outcomes(b) for a, b in zip(plain_steps, crashed_steps)],
        "relative": relative(crashed, plain),
    }


def past_the_budget() -> dict:
    from tests.rollout.vllm.tasks import TEMPERATURE, TINY_QWEN3, TurnTasks, make_learner
    from tests.rollout.vllm.test_engine import request
    from thundersync_lightning.core.errors import EngineError
    from thundersync_lightning.rollout import VLLMEngineConfig

    config = VLLMEngineConfig(
        temperature=TEMPERATURE, kv_cache_memory_bytes=64 << 20, max_model_len=128, multiprocessing=True,
        max_engine_restarts=0,
    )  # fmt: skip
    row: dict = {}
    with config.build(TINY_QWEN3, TurnTasks()) as engine:
        engine.publish(make_learner(1).state_dict(), 0)
        kill_cores(engine.engine_core_pids)
        for name, call in (
            ("rollout", lambda: list(engine.rollout(request(0, {0: 2})))),
            ("publish", lambda: engine.publish(make_learner(2).state_dict(), 1)),
        ):
            try:
                call()
                row[name] = ""
            except EngineError as exc:
                row[name] = str(exc)
    return row


if __name__ == "__main__":
    result = {"fits": fits(), "budget": past_the_budget()}
    print("RESULT " + json.dumps(result), flush=True)
    sys.exit(0)
