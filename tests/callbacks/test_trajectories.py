"""TrajectoryLogger: decoded trajectories to DIR/trajectories.jsonl and a W&B table, read back."""

from __future__ import annotations

import json

import lightning.pytorch as pl

from tests.callbacks.helpers import StatsStrategy, TinyPolicy, record, stats
from thundersync_lightning import show
from thundersync_lightning.callbacks import TrajectoryLogger, read_trajectories
from thundersync_lightning.callbacks.trajectories import decode_trajectory, pick_trajectories
from thundersync_lightning.core.types import Segment
from thundersync_lightning.envs.toy import GuessingGameTasks

GAME = GuessingGameTasks()  # 8 digits: 8 HIGHER, 9 LOWER, 10 OK, 11 BAD, 12 START


def played(i, step=0, reward=1.0):
    """Guess 3 (HIGHER), then 5 (OK)."""
    segments = (Segment((3,), True), Segment((8,), False), Segment((5,), True), Segment((10,), False))
    base = record(i, step=step, reward=reward, turns=2)
    return type(base)(
        **{**{f: getattr(base, f) for f in base.__slots__}, "prompt": (12,), "segments": segments}
    )


def test_a_trajectory_decodes_into_prompt_actions_and_observations():
    entry = decode_trajectory(played(0, step=3), GAME.decode, step=3)
    assert entry == {
        "step": 3, "trajectory_id": "s3-g0-t0", "group_id": "s3-g0", "policy_version": 0, "reward": 1.0,
        "unscorable": False, "failure": None, "finish_reason": "submit", "num_turns": 2,
        "truncated_actions": 0, "prompt": "START",
        "turns": [{"action": "3", "observation": "HIGHER"}, {"action": "5", "observation": "OK"}],
        "prompt_ids": [12],
        "segments": [{"scored": True, "ids": [3]}, {"scored": False, "ids": [8]},
                     {"scored": True, "ids": [5]}, {"scored": False, "ids": [10]}],
    }  # fmt: skip


def test_the_picked_trajectories_cover_the_groups_first():
    records = [played(i) for i in range(6)]  # groups g0 g0 g1 g1 g2 g2
    assert [r.trajectory_id for r in pick_trajectories(records, 4)] == [
        "s0-g0-t0",
        "s0-g1-t0",
        "s0-g2-t0",
        "s0-g0-t1",
    ]


def _fit(tmp_path):
    logger_cb = TrajectoryLogger(num_per_step=2, decode=GAME.decode)
    trainer = pl.Trainer(
        strategy=StatsStrategy(
            lambda step, rank, world: stats([played(i, step, float(i % 2)) for i in range(4)], step=step)
        ),
        max_steps=2, logger=False, callbacks=[logger_cb], log_every_n_steps=1, enable_checkpointing=False,
        enable_model_summary=False, enable_progress_bar=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(TinyPolicy())
    return logger_cb


def test_the_trajectory_log_round_trips_through_the_jsonl_file_and_show_prints_the_last_step(
    tmp_path, capsys
):
    logger_cb = _fit(tmp_path)
    assert logger_cb.path == tmp_path / "trajectories.jsonl"
    entries = read_trajectories(tmp_path)
    assert [(e["step"], e["trajectory_id"]) for e in entries] == [
        (0, "s0-g0-t0"), (0, "s0-g1-t0"), (1, "s1-g0-t0"), (1, "s1-g1-t0"),
    ]  # fmt: skip
    expected = [decode_trajectory(played(i, s, float(i % 2)), GAME.decode, s) for s in (0, 1) for i in (0, 2)]
    assert entries == json.loads(json.dumps(expected))
    for e in entries:  # the ids are kept: decoding them again gives the logged text
        assert [GAME.decode(s["ids"]) for s in e["segments"] if s["scored"]] == [
            t["action"] for t in e["turns"]
        ]

    assert show.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("--- step 1") == 2 and "--- step 0" not in out
    assert "[action 2]\n    | 5\n[observation 2]\n    | OK" in out


def test_a_resumed_fit_replaces_the_lines_of_the_steps_it_reruns_so_each_step_is_logged_once(tmp_path):
    # the first fit logged steps 0-3, then stopped; its checkpoint is at step 2, so steps 2 and 3 rerun
    old = [{"step": s, "trajectory_id": f"s{s}-old"} for s in range(4)]
    (tmp_path / "trajectories.jsonl").write_text("".join(json.dumps(e) + "\n" for e in old))
    trainer = pl.Trainer(
        strategy=StatsStrategy(
            lambda step, rank, world: stats([played(i, step + 2) for i in range(4)], step=step + 2)
        ),
        max_steps=2, logger=False, callbacks=[TrajectoryLogger(num_per_step=1, decode=GAME.decode)],
        log_every_n_steps=1, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(TinyPolicy())
    assert [(e["step"], e["trajectory_id"]) for e in read_trajectories(tmp_path)] == [
        (0, "s0-old"), (1, "s1-old"), (2, "s2-g0-t0"), (3, "s3-g0-t0"),
    ]  # fmt: skip
