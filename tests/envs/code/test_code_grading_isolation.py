"""No acting episode can observe a sibling's grading run (real bubblewrap sandboxes, real agent loop).

The channel: sandboxes share the read-only ``/usr``, and ``flock`` works on read-only descriptors,
so code under test that holds a lock on ``/usr/bin/python3`` while the hidden tests run is seen by a
sibling that polls the same lock. The group's verdicts wait until every sibling stopped acting.
"""

from __future__ import annotations

import pytest

from thundersync_lightning.core.types import ContentReady, derive_seed
from thundersync_lightning.envs.code import LocalCodeTasks
from thundersync_lightning.envs.codec import ByteCodec
from thundersync_lightning.rollout import AgentLoop, EnvPool, Generation, make_request
from thundersync_lightning.rollout.sampling import turn_seed

from .._support import needs_bwrap

CODEC = ByteCodec()
SEED = 11
TURNS = 4
# Appended by the first episode to the module under test: the grading run imports it and holds the lock.
LOCKER = (
    "import fcntl as _fcntl\nimport time as _time\n\n_lock = open('/usr/bin/python3', 'rb')\n"
    "_fcntl.flock(_lock, _fcntl.LOCK_SH)\n_time.sleep(3)\n"
)
POLL = (
    "import fcntl, time\nf = open('/usr/bin/python3', 'rb')\nfor _ in range(30):\n    try:\n"
    "        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        fcntl.flock(f, fcntl.LOCK_UN)\n"
    "    except BlockingIOError:\n        print('OBSERVED a grading run')\n        break\n"
    "    time.sleep(0.1)\nprint('polled')\n"
)


@needs_bwrap
@pytest.mark.slow
def test_an_acting_sibling_never_observes_the_grading_run_of_its_group():
    tasks = LocalCodeTasks(
        names=["leap_year"],
        max_turns=TURNS,
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_958_000,
        uid_count=8,
    )
    request = make_request(tasks, step=0, num_groups=1, group_size=2, seed=SEED)
    actions = {}
    writer = derive_seed(SEED, 0, 0, 0)
    actions[turn_seed(writer, 0)] = f"bash\ncat >> calendar_utils.py <<'EOF_L'\n{LOCKER}EOF_L"
    actions[turn_seed(writer, 1)] = "submit"
    poller = derive_seed(SEED, 0, 0, 1)
    for turn in range(TURNS):
        actions[turn_seed(poller, turn)] = f"bash\npython3 - <<'EOF_P'\n{POLL}EOF_P"

    def generate(requests):
        out = []
        for r in requests:
            tokens = tuple(CODEC.encode(actions[r.seed])) + (ByteCodec.END_OF_ACTION,)
            out.append(Generation(tokens, (0.0,) * len(tokens)))
        return out

    pool = EnvPool(4)
    events: list = []
    try:
        assert AgentLoop(tasks, generate, pool, step_timeout_s=120.0).run(request, 0, events.append).wait(300)
    finally:
        pool.shutdown()
    (sibling,) = [e.trajectory for e in events if isinstance(e, ContentReady) and e.trajectory.sample == 1]
    seen = "".join(CODEC.decode(s.tokens) for s in sibling.segments if not s.scored)
    assert seen.count("polled") == TURNS  # it acted (and polled) on every turn it had
    assert "OBSERVED" not in seen  # before: the grading run's lock was visible to it
