"""benchmarks/gpu_check.sh can run on a bare GPU machine: no wandb, jsonargparse or vllm.

The bare machine is imitated by a ``sitecustomize`` that makes those imports fail
(``sys.modules[name] = None``), so a top-level import of any of them on the check's path fails here
as it would there. (matplotlib cannot be hidden that way: torchmetrics imports it whenever its
distribution is installed; the benchmarks draw figures only where it imports.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABSENT = ("wandb", "jsonargparse", "vllm")
#: what the GPU check runs
SCRIPTS = (
    "verify_check.py",
    "overlap.py",
    "gpu_engine.py",
    "gpu_scale.py",
    "offload.py",
    "weight_sync.py",
    "split_backward.py",
    "_gpu_summary.py",
)


def bare_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine without ABSENT's packages (a sitecustomize blocking them)."""
    site = tmp_path / "bare-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in ABSENT)
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT / "src"), str(ROOT / "benchmarks")])
    return env


@pytest.mark.slow
def test_the_package_and_the_gpu_checks_scripts_import_without_wandb_jsonargparse_or_vllm(tmp_path):
    code = (
        "import runpy, sys\n"
        f"assert all(sys.modules.get(m, 0) is None for m in {ABSENT!r})  # the block is in place\n"
        "import thundersync_lightning, thundersync_lightning.verify, thundersync_lightning.modules\n"
        "import thundersync_lightning.strategy, thundersync_lightning.rollout, "
        f"thundersync_lightning.callbacks\nfor script in {SCRIPTS!r}:\n"
        f"    runpy.run_path({str(ROOT / 'benchmarks')!r} + '/' + script, run_name='imported')\n"
        "print('imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=bare_env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_the_gpu_checks_dry_run_runs_every_section_on_the_cpu_and_writes_the_summary(tmp_path):
    out = tmp_path / "gpu"
    env = {**bare_env(tmp_path), "PY": sys.executable, "OUT": str(out), "WHEELS": str(tmp_path / "no-wheels")}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=2400,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    sections = [line.split("\t") for line in (out / "sections.tsv").read_text().splitlines()]
    status = {name: state for name, state, *_ in sections}
    assert list(status) == [
        "paper",
        "paper_0.6B",
        "engine",
        "weight_sync_0.6B",
        "weight_sync_1.7B",
        "verify",
        "memory_tiny",
        "offload",
        "overlap",
        "split_backward",
    ]
    assert status.pop("paper_0.6B") == "not needed"  # the (tiny) paper section finished
    assert all(state == "ok" for state in status.values()), status
    # the slot's budget, before it starts: every section's planned seconds for the GPU sizes
    assert (
        "planned seconds per section on a GPU" in done.stdout
        and "past the budget: a second command" in done.stdout
    )
    summary = (out / "summary.md").read_text()
    assert "PASS" in summary and "MFU" in summary and "peak VRAM" in summary and "tokens/s" in summary
    assert "bf16_lora_pinned: skipped" in summary  # pinned needs CUDA: said, not failed
    assert "separate/split" in summary and "TRL" in summary
    for path in (
        "paper/overlap_paper.json",
        "engine/gpu_engine.json",
        "engine/trajectories.jsonl",
        "weight_sync_0.6B/weight_sync_transport.json",
        "weight_sync_1.7B/weight_sync_transport.json",
        "verify/verify.json",
        "overlap/overlap_long.json",
        "memory_tiny/gpu_scale.json",
        "offload/offload.json",
        "split_backward/split_backward.json",
    ):
        assert (out / path).is_file(), path
    engine = json.loads((out / "engine" / "gpu_engine.json").read_text())
    assert (
        engine["staleness_max"] == 0 and engine["turns_mean"] > 1
    )  # multi-turn: an error result lets it call again


@pytest.mark.slow
def test_a_dry_run_without_out_writes_to_a_scratch_folder_never_over_the_committed_gpu_record(tmp_path):
    committed = ROOT / "benchmarks" / "results" / "gpu"
    before = {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()}
    env = {
        **bare_env(tmp_path),
        "PY": sys.executable,
        "WHEELS": str(tmp_path / "no-wheels"),
        "ONLY": "offload",
        "TMPDIR": str(tmp_path),
    }
    env.pop("OUT", None)
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    scratch = [p for p in tmp_path.glob("gpu_check_dry_run.*") if p.is_dir()]
    assert len(scratch) == 1 and (scratch[0] / "offload" / "offload.json").is_file()
    assert {p: p.read_bytes() for p in committed.rglob("*") if p.is_file()} == before


def test_the_gpu_check_refuses_to_run_without_a_cuda_device_unless_it_is_a_dry_run(tmp_path):
    env = {**bare_env(tmp_path), "PY": sys.executable, "OUT": str(tmp_path / "gpu"), "WHEELS": str(tmp_path)}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and "no usable CUDA device" in done.stderr
    assert not (tmp_path / "gpu" / "sections.tsv").exists()  # nothing ran


@pytest.mark.slow
def test_only_runs_the_named_sections_and_records_the_others_as_not_selected(tmp_path):
    out = tmp_path / "gpu"
    out.mkdir()  # an earlier command's rows: kept, but the rerun section's old row is replaced
    (out / "sections.tsv").write_text(
        "verify\tok\t70\texit status 0\noffload\ttimeout\t45\texit status 124\n"
    )
    env = {
        **bare_env(tmp_path),
        "PY": sys.executable,
        "OUT": str(out),
        "WHEELS": str(tmp_path / "no-wheels"),
        "ONLY": "offload",
    }
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    status = {
        line.split("\t")[0]: line.split("\t")[1] for line in (out / "sections.tsv").read_text().splitlines()
    }
    rows = [line.split("\t")[0] for line in (out / "sections.tsv").read_text().splitlines()]
    assert rows.count("offload") == 1 and rows.count("verify") == 1
    assert status.pop("offload") == "ok" and status.pop("verify") == "ok"  # the earlier command's row
    assert set(status.values()) <= {"not selected", "not available"} and "paper" in status, status
    assert (out / "offload" / "offload.json").is_file() and not (out / "verify").exists()
