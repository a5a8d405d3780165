"""Set-ups that need their own process:
vLLM worker processes with file weight sync and a teacher (the GPU path), and a 3-step streaming fit through
the CLI with configs/toy_vllm.yaml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[3]


def run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    # this checkout's package first: the venv's editable install may point at another checkout
    pythonpath = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env = dict(os.environ, PYTHONPATH=pythonpath, HF_HUB_OFFLINE="1", WANDB_MODE="offline")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the in-process test engine set it for this process
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def test_worker_processes_with_file_weight_sync_and_a_teacher_match_transformers_after_each_publish(tmp_path):
    proc = run([sys.executable, "-m", "tests.rollout.vllm.mp_file_sync"], cwd=ROOT)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])

    assert result["refused_before_publish"]
    assert result["versions_v0"] == [0] and result["versions_v1"] == [1]
    assert result["max_logprob_error_v0"] <= 1e-4
    assert result["max_logprob_error_v1"] <= 1e-4
    assert result["max_teacher_error_v0"] <= 1e-4  # the teacher's engine process, tempered to T
    assert result["max_teacher_error_v1"] <= 1e-4
    assert result["tokens_v0"] != result["tokens_v1"]


def test_a_three_step_streaming_fit_with_the_vllm_engine_has_zero_staleness_everywhere(tmp_path):
    probe_path = tmp_path / "probe.json"
    extra = tmp_path / "probe.yaml"
    extra.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "callbacks": [
                        {
                            "class_path": "tests.rollout.vllm.probe.StalenessProbe",
                            "init_args": {"path": str(probe_path)},
                        }
                    ]
                }
            }
        )
    )
    cli = Path(sys.executable).with_name("thundersync-lightning")
    run(
        [
            str(cli),
            "fit",
            "--config",
            str(ROOT / "configs" / "toy_vllm.yaml"),
            "--config",
            str(extra),
            "--trainer.max_steps=3",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
            "--trainer.enable_progress_bar=false",
            "--data.groups_per_step=4",
            "--data.group_size=4",
        ],  # fmt: skip
        cwd=tmp_path,
    )
    rows = json.loads(probe_path.read_text())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())

    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["engine"] == "VLLMEngine" for r in rows)
    for r in rows:
        assert len(r["staleness"]) == 16
        assert set(r["staleness"]) == {0}
        assert set(r["versions"]) == {r["policy_version"]}
        assert r["publish_seconds"] is not None
    assert [r["policy_version"] for r in rows] == [0, 1, 2]
    assert summary["steps"] == 3 and summary["staleness_max"] == 0 and summary["trajectories"] == 48


def test_bucketed_weight_sync_into_worker_processes_matches_transformers_and_a_failed_publish_blocks_generation():  # noqa: E501
    proc = run([sys.executable, "-m", "tests.rollout.vllm.mp_stream_sync", "nccl", "ipc"], cwd=ROOT)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])

    for transport in ("nccl", "ipc"):  # nccl: a gloo group on CPU; ipc: the shared-file stand-in
        row = result[transport]
        assert row["weight_sync"] == transport
        assert row["error_v0"] <= 1e-4 and row["error_v1"] <= 1e-4
        # the learner's own error (it cannot read the meta tensor), which the workers stopped on too
        assert "failed half-way" in row["half_way"] and "meta" in row["half_way"]
        assert "the workers stopped there too" in row["half_way"]
        assert "refusing to generate" in row["refused_after_half_way"]
        assert row["publish_seconds"] is not None
