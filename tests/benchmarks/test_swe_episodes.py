"""benchmarks/swe_episodes.py:
a SWE-bench run's episodes -> summary.json's swebench section and a replay trace."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from thundersync_lightning.core.types import derive_seed
from thundersync_lightning.rollout.replay import load_trace

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _episode(seed: int, episode_s: float, reward: float | None, verdict: str | None, **phases) -> dict:
    return {
        "instance_id": f"lib__lib-{seed}",
        "seed": seed,
        "episode_s": episode_s,
        "reward": reward,
        "resolved": None if reward is None else reward == 1.0,
        "verdict": verdict,
        "commands": 1,
        "container_start_s": phases.get("start", 1.0),
        "commands_s": phases.get("commands", 0.5),
        "verdict_s": phases.get("verdict_s", 2.0),
        "error": None if reward is not None else "open: boom",
    }


def test_the_summary_gets_the_resolved_rate_episode_times_and_phases_and_the_trace_replays(
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(BENCH))
    import swe_episodes

    s00, s01 = derive_seed(0, 0, 0, 0), derive_seed(0, 0, 0, 1)
    episodes = [
        _episode(s00, 10.0, 1.0, "resolved"),
        _episode(s01, 20.0, 0.0, "empty patch", verdict_s=4.0),
        _episode(5, 30.0, None, None),
    ]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes) + "{broken\n")
    trajectories = [
        {
            "step": 0,
            "trajectory_id": "s0-g0-t0",
            "segments": [
                {"scored": True, "ids": [1, 2, 3]},
                {"scored": False, "ids": [4]},
                {"scored": True, "ids": [5]},
            ],
        }
    ]
    (tmp_path / "trajectories.jsonl").write_text(json.dumps(trajectories[0]) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 1, "learner_idle_fraction": 0.25}))
    section = swe_episodes.main([str(tmp_path), "--max-action-tokens", "7"])

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["swebench"] == section and summary["steps"] == 1
    assert section["episodes"] == 3 and section["graded"] == 2 and section["resolved"] == 1
    assert section["resolved_rate"] == 0.5 and section["reward_mean"] == 0.5
    assert section["episode_seconds"]["median"] == 20.0 and section["episode_seconds"]["max"] == 30.0
    assert section["episode_seconds"]["p90"] == 28.0  # 20 + 0.8 x (30 - 20)
    # generation = episode - (1.0 start + 0.5 commands + verdict): 6.5, 14.5, 26.5
    assert section["phase_seconds_median"] == {
        "generation_s": 14.5,
        "container_start_s": 1.0,
        "commands_s": 0.5,
        "verdict_s": 2.0,
    }
    assert section["verdicts"] == {"resolved": 1, "empty patch": 1, "None": 1}
    assert section["errors"] == ["open: boom"] and section["learner_idle_fraction"] == 0.25
    trace = json.loads((tmp_path / "swe_trace.json").read_text())
    assert [(r["content_ready"], r["reward_ready"], r["scored_tokens"]) for r in trace["rows"]] == [
        (8.0, 10.0, 4),
        (16.0, 20.0, 7),
        (28.0, 30.0, 7),
    ]  # tokens: the logged trajectory's scored ids, else 7
    assert len(load_trace(str(tmp_path / "swe_trace.json"))) == 3


@pytest.mark.slow  # three fits of overlap.py's learner (about a minute on 2 cores)
def test_swe_overlap_replays_a_runs_trace_and_writes_measured_projected_and_paper_side_by_side(
    tmp_path: Path,
) -> None:
    sys.path.insert(0, str(BENCH))
    import swe_overlap

    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {
            "content_ready": 5.0 + i,
            "reward_ready": 8.0 + 3 * i,
            "scored_tokens": 20,
            "instance_id": f"lib-{i % 2}",
        }
        for i in range(6)
    ]
    (run / "swe_trace.json").write_text(json.dumps({"rows": rows}))
    (run / "summary.json").write_text(
        json.dumps(
            {
                "steps": 2,
                "trajectories": 16,
                "learner_idle_fraction": 0.9,
                "step_seconds_median": 10.0,
                "swebench": {"episodes": 6},
            }
        )
    )
    report = tmp_path / "validation.json"
    report.write_text(
        json.dumps(
            {
                "instances": [
                    {"instance_id": "lib-0", "gold_eval_s": 4.0},
                    {"instance_id": "lib-1", "gold_eval_s": 6.0},
                ]
            }
        )
    )
    out = tmp_path / "out"
    result = swe_overlap.main(
        [
            "--run",
            str(run),
            "--out",
            str(out),
            "--quick",
            "--graded",
            str(report),
            "--rounds",
            "1",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--groups",
            "2",
            "--group-size",
            "2",
            "--calibration-batches",
            "1",
            "--calibration-reps",
            "1",
            "--calibration-samples",
            "1",
        ]
    )
    graded = json.loads((out / "swe_cpu_trace_graded.json").read_text())["rows"]
    assert [r["reward_ready"] for r in graded] == [
        r["content_ready"] + (4.0 if i % 2 == 0 else 6.0) for i, r in enumerate(rows)
    ]
    m, p = result["measured"], result["projected"]
    assert m["learner_seconds_per_trajectory"] == (1 - 0.9) * 10.0 * 2 / 16
    assert 0.0 < m["sync_idle_at_measured_cost"] < 1.0
    assert p["batch"] == [2, 2] and p["bound_speedup"] > 0 and p["file"] == "overlap_swe_cpu_graded.json"
    assert result["paper"]["sync_idle_fraction"] == 0.495 and result["paper"]["streaming_speedup"] == 1.91
    assert (out / "swe_cpu_overlap_graded.json").is_file() and (out / "swe_cpu_overlap_graded.png").is_file()
