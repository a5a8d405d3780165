"""configs/swebench_cpu.yaml through `thundersync-lightning fit`: two committed real-library instances, in
podman containers of their images, graded by swebench, one gold and one empty patch.

A random byte policy writes no valid command, so the agent's diff is whatever its /testbed holds
against the instance's base commit. For the gold instance the task source (``swe_gold_tasks.py``)
applies the gold patch in the container right after the workspace opens, as an agent's edit would
be: its every episode must resolve. The other is left untouched: an empty patch, never resolved.
Needs ``make demo-swe``'s images (scripts/build_swe_instances.py images).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
INSTANCES = os.path.join(ROOT, "configs", "data", "swe_cpu_instances.jsonl")


@pytest.mark.container
def test_the_cpu_config_fits_a_step_where_the_gold_instance_resolves_and_the_empty_one_does_not(tmp_path):
    if shutil.which("podman") is None:
        pytest.skip("needs podman (make test-containers)")
    with open(INSTANCES) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    gold, empty = rows[0], next(r for r in rows if r["repo"] != rows[0]["repo"])
    for row in (gold, empty):
        if subprocess.run(["podman", "image", "exists", row["image"]]).returncode != 0:
            pytest.skip(f"needs the instance images (scripts/build_swe_instances.py images): {row['image']}")
    instances = tmp_path / "instances.jsonl"
    instances.write_text(json.dumps({**gold, "tsl_test_apply_gold": True}) + "\n" + json.dumps(empty) + "\n")

    with open(os.path.join(ROOT, "configs/swebench_cpu.yaml")) as f:
        config = yaml.safe_load(f)
    config["trainer"].update(default_root_dir=str(tmp_path), max_steps=1, enable_progress_bar=False)
    config["data"].update(groups_per_step=2, group_size=2)
    episodes = tmp_path / "episodes.jsonl"
    config["data"]["tasks"]["class_path"] = "tests.envs.swe_gold_tasks.GoldPatchSWEbenchTasks"
    config["data"]["tasks"]["init_args"].update(
        instances=str(instances),
        max_turns=1,
        max_action_tokens=8,
        episode_log=str(episodes),
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_990_000,
        uid_count=16,
    )
    path = tmp_path / "swebench_cpu.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = os.path.join(os.path.dirname(sys.executable), "thundersync-lightning")
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        WANDB_MODE="offline",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
    )
    run = subprocess.run(
        [cli, "fit", "--config", str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500
    )
    assert run.returncode == 0, run.stderr[-3000:]

    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert summary["steps"] == 1 and summary["trajectories"] == 4
    assert summary["reward_mean_first"] == 0.5 and summary["reward_error_fraction"] == 0.0
    with open(episodes) as f:
        lines = [json.loads(line) for line in f]
    by_instance: dict[str, list[dict]] = {}
    for e in lines:
        by_instance.setdefault(e["instance_id"], []).append(e)
    assert sorted(by_instance) == sorted([gold["instance_id"], empty["instance_id"]])
    for e in by_instance[gold["instance_id"]]:
        assert e["reward"] == 1.0 and e["resolved"] and e["verdict"] == "resolved"
        f2p = len(json.loads(gold["FAIL_TO_PASS"]))
        assert e["tests"]["FAIL_TO_PASS"] == {"success": f2p, "failure": 0}
    for e in by_instance[empty["instance_id"]]:
        assert e["reward"] == 0.0 and not e["resolved"] and e["verdict"].startswith("empty patch")
    for e in lines:
        assert e["error"] is None and e["container_start_s"] > 0 and e["verdict_s"] > 0
        assert e["episode_s"] >= e["container_start_s"] + e["verdict_s"]
