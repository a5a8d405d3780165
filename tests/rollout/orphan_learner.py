"""A learner process for test_lifeline_parent_death: builds an embedded engine, keeps it busy, waits.

``python -m tests.rollout.orphan_learner METHOD``: the engine's start method (forkserver or spawn).
Prints ``<learner pid> <engine pid>`` once the engine is generating, then blocks on stdin. The
engine's main thread is stuck in an environment step (a 10-minute step timeout), so only the
parent-death mechanisms (not the idle command loop) can end it when this process is killed.
"""

from __future__ import annotations

import os
import sys

from tests.rollout.scripted import ScriptedTasks
from thundersync_lightning.envs.toy import toy_model_spec
from thundersync_lightning.rollout import EmbeddedEngineConfig, make_request
from thundersync_lightning.rollout.hf_model import build_model

if __name__ == "__main__":
    spec = toy_model_spec()
    tasks = ScriptedTasks(modes=("step_hangs",))
    engine = EmbeddedEngineConfig(step_timeout_s=600, start_method=sys.argv[1]).build(spec, tasks)
    engine.publish(build_model(spec).state_dict(), version=0)
    events = engine.rollout(make_request(tasks, step=0, num_groups=1, group_size=2, seed=0))
    while engine.applied_version is None:  # the process took the snapshot and is generating
        engine._pump()
    print(os.getpid(), engine.pid, flush=True)
    sys.stdin.read()
