"""Ways out of a zero through the grader, each written as an agent would: a workspace filled to its
disk budget (grading itself failed with ENOSPC, the episode was dropped as an environment failure),
and a pytest configuration the graded run read from the agent's tree."""

from __future__ import annotations

import pytest

from thundersync_lightning.envs.code import ByteCodec, LocalCodeTasks

from ._support import needs_bwrap

CODEC = ByteCodec()
FIX = ("replace calendar_utils.py\n<<<<<<< SEARCH\n    return year % 4 == 0 and year % 100 != 0\n=======\n"
       "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n>>>>>>> REPLACE")


def act(env, text: str):  # noqa: ANN001, ANN201
    return CODEC.decode(env.step(CODEC.encode(text) + (ByteCodec.END_OF_ACTION,)).observation)


@needs_bwrap
@pytest.mark.parametrize("fixed", [True, False])
def test_a_workspace_filled_to_its_disk_budget_is_graded_like_any_other(fixed):
    source = LocalCodeTasks(names=["leap_year"], sandbox_root="/tmp/thundersync-test-sandboxes", uid_base=3_960_000,
                            uid_count=64, disk_bytes=8 * 1024**2, disk_inodes=2_000)
    env = source.make_env(source.all_tasks[0], 0)
    try:
        env.reset()
        if fixed:
            assert "edited" in act(env, FIX)
        full = act(env, "bash dd if=/dev/zero of=fill bs=64k count=1000; touch more; echo done")
        assert "No space left on device" in full
        outcome = env.outcome()  # before: OSError ENOSPC while copying the repository for grading
    finally:
        env.close()
    assert outcome.resolved is fixed, outcome.reason
