"""Smoke tests of the benchmark scripts: tiny settings, the JSON keys the README and issue 6 rely on.

No timing thresholds: these only check that each script runs end to end through the real code
paths and writes its JSON (with command and machine description) and PNG.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _read(out: Path, name: str) -> dict:
    assert (out / f"{name}.png").stat().st_size > 0
    data = json.loads((out / f"{name}.json").read_text())
    assert data["command"] and data["machine"]["cpu_count"] >= 1
    assert "load_average_start" in data
    return data


def test_overlap_smoke(tmp_path: Path) -> None:
    _load("overlap").main(
        [
            "--out", str(tmp_path), "--threads", "1", "--rounds", "1", "--steps", "2", "--warmup", "1",
            "--groups", "2", "--group-size", "2", "--hidden", "64", "--layers", "1", "--vocab", "64",
            "--time-scale", "0.001", "--calibration-samples", "2", "--calibration-reps", "1",
        ]
    )  # fmt: skip
    data = _read(tmp_path, "overlap")
    for key in ("speedup_streaming_vs_sync", "speedup_async_vs_sync", "bound_speedup", "efficiency"):
        assert data[key] > 0
        assert data["throughput"][key] > 0
    assert data["peak_flops"] > 0 and data["calibration"]["time_scale_s"] == 0.001
    for mode in ("sync", "streaming", "async"):
        r = data["modes"][mode]
        for key in ("median_step_s", "learner_idle_fraction", "mfu", "staleness_max"):
            assert key in r
    assert data["modes"]["sync"]["staleness_max"] == 0
    assert data["modes"]["streaming"]["staleness_max"] == 0
    assert data["modes"]["async"]["staleness_max"] == 1
    assert data["without_release_dates"]["bound_step_s"] > 0
    # one measured step: each mode's calls by next_batch's rule add up to the step's 4 trajectories
    assert set(data["modes"]["sync"]["backward_by_path_median"]) == {"direct"}
    for mode in ("sync", "streaming", "async"):
        paths = data["modes"][mode]["backward_by_path_median"]
        assert set(paths) <= {"direct", "bucket", "held"}
        assert sum(p["trajectories"] for p in paths.values()) == 4
    for step in data["per_step"].values():  # each step's bound holds that step's cheapest learner work
        assert step["learner_work_s"] == min(step["sync_busy_s"], step["streaming_busy_s"])
        assert step["bound_s"] >= step["release_bound_s"] >= step["learner_work_s"]


def test_release_bound_is_the_single_machine_bound_with_release_dates() -> None:
    bound = _load("overlap").release_bound
    # two equal trajectories landing at 0 and 10 s, 4 s of work: the second's 2 s start at 10 at the earliest
    assert bound([(10.0, 5), (0.0, 5)], 1.0, 4.0) == 12.0
    # everything landing early: the work itself is the bound; the scale converts units to seconds
    assert bound([(0.0, 1), (1.0, 3)], 0.5, 8.0) == 8.0
    # a long trajectory landing last carries its token share: 5 + 4 * 3/4 = 8
    assert bound([(0.0, 1), (5.0, 3)], 1.0, 4.0) == 8.0


def test_overlap_long_workload_with_set_up_and_balance_calibration_smoke(tmp_path: Path) -> None:
    _load("overlap").main(
        [
            "--workload", "long", "--out", str(tmp_path), "--threads", "1", "--rounds", "1", "--steps", "2",
            "--warmup", "1", "--groups", "2", "--group-size", "2", "--hidden", "64", "--layers", "1",
            "--vocab", "64",
            "--prompt-tokens", "8", "--token-scale", "0.5", "--setup-fraction", "0.1", "--no-prepare-ahead",
            "--calibration-samples", "2", "--calibration-reps", "1", "--calibration-batches", "1",
        ]
    )  # fmt: skip
    data = _read(tmp_path, "overlap_long")
    assert data["workload_name"] == "long" and data["calibration"]["calibrate"] == "balance"
    assert data["calibration"]["time_scale_s"] > 0
    assert data["workload"]["setup_fraction"] == 0.1 and data["workload"]["prepare_ahead"] is False
    assert set(data["targets_met"]) >= {
        "efficiency",
        "streaming_throughput_over_async",
        "streaming_over_sync_learner_work",
    }
    assert data["diagnosis"]["streaming_over_sync_learner_work"] > 0
    assert data["modes"]["streaming"]["staleness_max"] == 0 and data["modes"]["async"]["staleness_max"] == 1


def test_memory_smoke(tmp_path: Path) -> None:
    _load("memory").main(
        [
            "--out", str(tmp_path), "--threads", "1", "--sizes", "S", "--max-groups", "2",
            "--offloads", "none", "cpu",
            "--strategy-steps", "1", "--strategy-groups", "2", "--strategy-group-size", "2",
            "--strategy-bounds", "0", "1", "--strategy-time-scale", "0.0005",
        ]
    )  # fmt: skip
    data = _read(tmp_path, "memory")
    for curve in data["accumulator"]:
        assert curve["ratio_accounted_over_analytic"] == pytest.approx(1.0)
        assert set(curve["peak_bytes"]) == {"device", "pinned_host", "pageable_host"}
    by_offload = {c["offload"]: c for c in data["accumulator"]}
    assert by_offload["cpu"]["curve"][-1]["accumulator_bytes"]["pageable_host"] > 0
    assert by_offload["none"]["curve"][-1]["accumulator_bytes"]["pageable_host"] == 0
    assert [r["max_open_groups"] for r in data["strategy"]] == [None, 1, None]
    for run in data["strategy"]:  # the plan's accumulator rows bound what the strategy reached
        assert run["peak_over_planned"] <= 1.0, run


@pytest.mark.slow  # 40 s; make test-slow
def test_sample_efficiency_smoke(tmp_path: Path) -> None:
    _load("sample_efficiency").main(
        ["--out", str(tmp_path), "--threads", "1", "--steps", "2", "--groups", "2", "--group-size", "2",
         "--latency-median", "0", "--sgd-steps", "1"]
    )  # fmt: skip
    data = _read(tmp_path, "sample_efficiency")
    assert data["param_distance_streaming_vs_sync"] < 1e-3
    assert data["param_distance_async_vs_sync"] > 0
    assert set(data["modes"]) == {"sync", "streaming", "async"}
    assert data["sgd_check"]["param_distance_streaming_vs_sync"] < 1e-3


def test_boundary_cut_smoke(tmp_path: Path) -> None:
    data = _load("boundary_cut").main(
        [
            "--out", str(tmp_path), "--threads", "1", "--groups", "2", "--group-size", "2", "--prompt", "12",
            "--action", "4", "--hidden", "64", "--layers", "1", "--vocab", "32", "--repeats", "1",
        ]
    )  # fmt: skip
    written = _read(tmp_path, "boundary_cut")
    assert written["learner_tokens"] == data["learner_tokens"]
    assert data["learner_tokens"]["cut"] < data["learner_tokens"]["uncut"]
    assert data["gradient_rel_diff"] <= 1e-5
    assert data["learner_work_ratio_cpu"] > 0


def test_split_backward_smoke(tmp_path: Path) -> None:
    data = _load("split_backward").main(
        ["--out", str(tmp_path), "--threads", "1", "--groups", "3", "--group-size", "2", "--repeats", "1",
         "--models", "toy"]
    )  # fmt: skip
    toy = _read(tmp_path, "split_backward")["models"]["toy"]
    assert data["device"] == "cpu" and data["device_name"] is None
    assert toy["seconds"] == data["models"]["toy"]["seconds"]
    assert toy["trajectories"] == 6 and toy["destinations"] == 1 + 2 + 2  # direct, two buckets, two pending
    assert toy["backward_passes"]["split"] == toy["backward_passes"]["split_dense"] == 1
    assert toy["backward_passes"]["split"] < toy["backward_passes"]["per_job"]
    assert set(toy["gradient_rel_diff_vs_per_job"]) == {"separate", "split", "split_dense"}
    assert max(toy["gradient_rel_diff_vs_per_job"].values()) <= 1e-5
    assert toy["separate_over_split_wall"] > 0 and toy["split_dense_over_split_cpu"] > 0


@pytest.mark.slow  # two fits with their engine start-ups: ~40 s on an idle 2-core box, minutes when loaded
def test_opd_smoke(tmp_path: Path) -> None:
    import torch

    from thundersync_lightning.envs.toy import toy_model_spec
    from thundersync_lightning.rollout import build_model

    spec = toy_model_spec()
    teacher = build_model(spec)
    ckpt = tmp_path / "teacher.ckpt"  # laid out like a GRPOPolicy Lightning checkpoint
    hparams = {"model_type": spec.model_type, "config": dict(spec.config), "dtype": "float32", "lora": None}
    torch.save(
        {
            "hyper_parameters": hparams,
            "state_dict": {f"model.{k}": v for k, v in teacher.state_dict().items()},
        },
        ckpt,
    )
    bench = _load("opd")
    common = [
        "--threads",
        "1",
        "--teacher",
        str(ckpt),
        "--groups",
        "2",
        "--group-size",
        "2",
        "--max-steps",
        "2",
    ]
    bench.main([*common, "--out", str(tmp_path / "a"), "--arms", "opd", "--seed-list", "0"])
    bench.main([*common, "--out", str(tmp_path / "b"), "--arms", "grpo", "--seed-list", "0"])
    bench.main(
        [
            "--out",
            str(tmp_path),
            "--merge",
            str(tmp_path / "a" / "opd.json"),
            str(tmp_path / "b" / "opd.json"),
        ]
    )
    data = _read(tmp_path, "opd")
    assert [(r["arm"], len(r["rewards"])) for r in data["runs"]] == [("opd", 2), ("grpo", 2)]
    assert set(data["summary"]) == {"opd", "grpo"} and data["objectives"]["opd"]["reward_coef"] == 0.0


@pytest.mark.slow  # eight short fits (~10 s)
def test_time_to_target_smoke_writes_medians_per_mode_and_skips_finished_runs(tmp_path: Path, capsys) -> None:
    argv = [
        "--out", str(tmp_path), "--threads", "1", "--seeds", "0", "--workloads", "toy",
        "--modes", "async_is", "--max-steps", "2", "--groups", "2", "--group-size", "2",
    ]  # fmt: skip
    module = _load("time_to_target")
    module.main(argv)
    data = _read(tmp_path, "time_to_target")
    assert set(data["median_seconds"]["toy"]) == set(data["median_steps"]["toy"]) == {"async_is"}
    for run in data["runs"]:
        assert run["budget_steps"] == 2 and run["steps_run"] == 2 and len(run["rewards"]) == 2
        assert run["reached"] is False and run["seconds"] is None  # 10-step window: not reachable in 2
        assert 0 < run["last_verdict_s_median"] and 0 <= run["after_last_verdict_s_median"]
        assert run["step_s_median"] > 0 and run["learner_s_per_token_median"] > 0
        assert run["release_floor_s_median"] is None  # no sync run to take the learner's rate from
    assert data["workloads"]["toy"]["modes"]["async_is"]["reached"] == "0/1"
    assert data["workloads"]["toy"]["modes"]["async_is"]["median_seconds"] is None  # not reached
    capsys.readouterr()
    module.main(argv)  # everything already measured with these settings: nothing reruns
    assert capsys.readouterr().out.count("skipped") == 1
    assert json.loads((tmp_path / "time_to_target.json").read_text())["runs"] == data["runs"]


def test_time_to_target_balanced_workload_takes_its_own_groups_and_context() -> None:
    module = _load("time_to_target")
    args = argparse.Namespace(
        groups=16, group_size=8, lr=3e-3, threads=1, max_steps=300, balanced_hidden=64,
        balanced_context_tokens=70, balanced_groups=3, balanced_latency_median_s=0.002, split_backward=True,
        max_batch_trajectories=32, max_batch_tokens=None, min_batch_trajectories="auto",
    )  # fmt: skip
    model, tasks = module.workload(args, "balanced")
    assert tasks.context_tokens == 70 and tasks.latency_median_s == 0.002
    assert model["max_position_embeddings"] >= tasks.max_episode_tokens()
    assert module.groups(args, "balanced") == 3 and module.groups(args, "toy") == 16
    assert module.settings(args, "balanced", "sync")["groups"] == 3
    assert module.settings(args, "balanced", "sync")["context_tokens"] == 70
    assert "context_tokens" not in module.settings(args, "toy", "sync")  # stored toy runs stay comparable
    # the split backward changes streaming's learner calls only: a stored streaming run without it is redone
    assert module.settings(args, "toy", "streaming")["split_backward"] is True
    # the row wait changes streaming's and async's calls: stored with them (runs before it waited for nothing)
    assert module.settings(args, "toy", "streaming")["min_batch_trajectories"] == "auto"
    assert module.settings(args, "toy", "async")["min_batch_trajectories"] == "auto"
    assert "min_batch_trajectories" not in module.settings(args, "toy", "sync")
    assert "split_backward" not in module.settings(args, "toy", "async")
    # a learner call's caps change every mode's calls; the defaults are not stored (earlier runs still match)
    assert "max_batch_tokens" not in module.settings(args, "toy", "sync")
    args.max_batch_tokens = 256
    assert module.settings(args, "toy", "sync")["max_batch_tokens"] == 256
    args.max_batch_tokens = None
    toy_model, _ = module.workload(args, "toy")
    args.balanced_context_tokens = 0
    balanced_model, _ = module.workload(args, "balanced")
    assert balanced_model == toy_model  # the default balanced workload: the toy's model


def test_time_to_target_counts_an_unreached_run_as_slower_and_two_unreached_medians_as_undecided() -> None:
    module = _load("time_to_target")

    def summary(**seconds):
        return {m: {"median_seconds": s} for m, s in seconds.items()}

    assert module.targets_met(summary(streaming=10.0, **{"async": None}, async_is=9.0), "toy") == {
        "streaming_le_async": True,  # async never reached 0.9 within its budget
        "streaming_le_async_is": False,
    }
    both_unreached = module.targets_met(
        summary(streaming=None, **{"async": None}, async_is=None, sync=None), "balanced"
    )
    assert both_unreached == {
        "streaming_le_async": None,
        "streaming_le_async_is": None,
        "streaming_le_0.6x_sync": None,
    }
    assert (
        module.targets_met(summary(streaming=50.0, sync=80.0), "balanced")["streaming_le_0.6x_sync"] is False
    )


def test_gpu_scale_runs_tiny_on_cpu_and_records_why_pinned_and_fsdp2_were_skipped(tmp_path: Path) -> None:
    _load("gpu_scale").main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--threads", "1"])
    data = _read(tmp_path, "gpu_scale")
    variants = data["variants"]
    assert "CUDA" in variants["bf16_pinned"]["skipped"]
    assert "processes" in data["not_applicable"]["fsdp2"]
    assert variants["fp32"]["param_dtype"] == "torch.float32"
    assert variants["bf16"]["param_dtype"] == "torch.bfloat16"
    assert variants["bf16_zero1"]["strategy_options"] == {"sharding": "zero1"}
    for name in ("fp32", "bf16", "bf16_zero1"):
        r = variants[name]
        assert r["steps"] == 1 and r["median_step_s"] > 0
        assert r["peak_device_bytes"] is None and "CUDA" in r["peak_device_bytes_reason"]
        # the plan bounds the replayed episodes (trace lengths, not the game's) and counts every buffer
        assert r["planned_tokens_per_trajectory"] >= r["longest_trajectory_tokens"]
        assert r["planned_rows"]["activations"] > 0
        assert r["planned_rows"]["group sums"] + r["planned_rows"]["held gradients"] > 0
    assert set(data["ratios"]) == {"bf16/fp32", "bf16_zero1/bf16"}


def test_micro_batches_smoke_times_both_cuts_of_the_same_calls(tmp_path: Path) -> None:
    _load("micro_batches").main(["--out", str(tmp_path), "--sizes", "8", "--repeats", "1"])
    call = _read(tmp_path, "micro_batches")["calls"]["8"]
    assert set(call["seconds"]) == {"0", "16", "32", "64"} and set(call["wall_0_over"]) == {"16", "32", "64"}
    # 8 game trajectories (3-9 tokens): the padding share alone cuts more forwards than with 64 tokens
    assert call["forwards_median"]["0"] > call["forwards_median"]["64"] >= 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_split_backward_bench_refuses_cuda_without_a_device_before_building_a_model(capsys) -> None:
    with pytest.raises(SystemExit):
        _load("split_backward").main(["--device", "cuda", "--models", "large"])
    assert "no usable CUDA device" in capsys.readouterr().err


def test_split_backward_flag_takes_auto_true_false_and_rejects_anything_else() -> None:
    common = _load("_common")
    parser = argparse.ArgumentParser()
    common.add_split_backward_arg(parser)
    assert parser.parse_args([]).split_backward == "auto"
    assert parser.parse_args(["--split-backward"]).split_backward == "auto"  # bare flag
    assert parser.parse_args(["--split-backward", "TRUE"]).split_backward is True
    assert parser.parse_args(["--split-backward", "false"]).split_backward is False
    assert parser.parse_args(["--no-split-backward"]).split_backward is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--split-backward", "yes"])


def test_time_to_target_summary_gives_streaming_its_last_verdict_floor_against_sync() -> None:
    module = _load("time_to_target")

    def run(mode: str, seconds_run: float, last_verdict: float | None) -> dict:
        return {
            "mode": mode, "reached": True, "seconds": seconds_run, "steps": 10, "budget_steps": 10,
            "seed": 0, "learner_idle_fraction": 0.5, "seconds_run": seconds_run, "steps_run": 10,
            "last_verdict_s_median": last_verdict, "after_last_verdict_s_median": 0.01,
        }  # fmt: skip

    sync, stream = run("sync", 2.0, 0.11), run("streaming", 1.5, 0.12)
    sync.update(step_s_median=0.25, release_floor_s_median=0.2)
    stream.update(step_s_median=0.2, release_floor_s_median=0.15)
    out = module.summarise([sync, stream])
    # sync: 0.2 s a step; streaming: 0.15 s a step, its last verdict 0.12 s after the step's start
    assert out["streaming"]["step_over_sync_step"] == pytest.approx(0.75)
    assert out["streaming"]["last_verdict_over_sync_step"] == pytest.approx(0.6)
    # medians of per-step values: streaming's median step and its release-date
    # floor against sync's median step
    assert out["streaming"]["step_median_over_sync_step"] == pytest.approx(0.8)
    assert out["streaming"]["release_floor_over_sync_step"] == pytest.approx(0.6)
    assert (
        "last_verdict_over_sync_step" not in out["sync"] and "release_floor_over_sync_step" not in out["sync"]
    )
    alone = module.summarise([run("streaming", 1.5, 0.12)])["streaming"]
    assert "last_verdict_over_sync_step" not in alone and "release_floor_over_sync_step" not in alone
    # runs stored before the floor existed: no figure rather than a wrong one
    assert (
        "release_floor_over_sync_step" not in module.summarise([run("sync", 2.0, 0.11), stream])["streaming"]
    )


def test_time_to_target_release_floor_is_the_last_verdict_or_the_work_after_late_content() -> None:
    module = _load("time_to_target")
    until = module._Until()
    # step 0: content of 10 tokens at 0 s and 30 tokens at 1 s, last verdict 1.2 s; 1 s of work per 10 tokens
    # step 1: all 40 tokens at 0 s (4 s of work), last verdict 5 s: the verdict is the floor
    until.last_verdict = [1.2, 5.0]
    until.arrivals = [[(0.0, 10), (1.0, 30)], [(0.0, 40)]]
    assert until.floors(0.1) == pytest.approx([1.0 + 3.0, 5.0])  # the late 30 tokens' 3 s after they land
    assert until.floors(0.01) == pytest.approx([1.3, 5.0])
    runs = [{"workload": "toy", "mode": "sync", "learner_s_per_token_median": r} for r in (0.1, 0.3, 0.2)]
    runs.append({"workload": "toy", "mode": "streaming", "learner_s_per_token_median": 9.0})
    runs.append({"workload": "toy", "mode": "sync"})  # stored before the rate was recorded
    assert module.sync_rate(runs, "toy") == pytest.approx(0.2) and module.sync_rate(runs, "balanced") is None


@pytest.mark.slow  # runs the token-cap benchmark end to end (~30 s)
def test_token_cap_smoke_the_plan_bounds_every_setting_s_largest_call(tmp_path: Path) -> None:
    _load("token_cap").main(["--out", str(tmp_path), "--groups", "2", "--repeats", "1"])
    data = _read(tmp_path, "token_cap")
    settings = data["settings"]
    assert set(settings) == {"rows 32 (default)", "rows 8", "tokens 4096", "tokens 8192"}
    for label, row in settings.items():
        assert 0 < row["measured_over_planned"] <= 1.0, (label, row)  # the saved-for-backward bytes
        cap = row["max_batch_tokens"]
        assert cap is None or row["largest_call_tokens"] <= cap
    assert settings["rows 8"]["calls"] == 2 and settings["rows 32 (default)"]["calls"] == 1  # 16 trajectories
    assert (
        data["padding_mask"]["bytes_with_over_without"] > 1.0
    )  # the mask the policy no longer passes is saved too
    assert (tmp_path / "token_cap.png").exists()


def test_call_cap_flags_default_to_the_strategys_own_defaults() -> None:
    import inspect

    from thundersync_lightning.strategy import ThunderSyncStrategy

    parser = argparse.ArgumentParser()
    _load("_common").add_call_cap_args(parser)
    defaults = inspect.signature(ThunderSyncStrategy).parameters
    args = parser.parse_args([])
    assert args.max_batch_trajectories == defaults["max_batch_trajectories"].default
    assert args.max_batch_tokens == defaults["max_batch_tokens"].default
    assert parser.parse_args(["--max-batch-tokens", "4096"]).max_batch_tokens == 4096
    assert args.min_batch_trajectories == defaults["min_batch_trajectories"].default
    assert parser.parse_args(["--min-batch-trajectories", "auto"]).min_batch_trajectories == "auto"
    assert parser.parse_args(["--min-batch-trajectories", "8"]).min_batch_trajectories == 8


def test_learner_calls_smoke_counts_every_trajectory_of_every_kept_step_once(tmp_path: Path) -> None:
    _load("learner_calls").main(["--out", str(tmp_path), "--steps", "3", "--warmup", "1", "--groups", "2",
                                 "--min-batch-trajectories", "1", "4"])  # fmt: skip
    data = _read(tmp_path, "learner_calls")
    assert set(data["modes"]) == {"sync", "streaming", "streaming_min4"}
    assert data["modes"]["streaming_min4"]["waited_for_rows_median"] == 4
    assert data["modes"]["sync"]["step_over_sync"] == data["modes"]["sync"]["cpu_over_sync"] == 1.0
    for mode in ("sync", "streaming", "streaming_min4"):
        cells = [v for cell in data["modes"][mode]["by_call_size"].values() for v in cell.values()]
        assert sum(v["trajectories"] for v in cells) == 2 * 2 * 8  # 2 kept steps of 2 groups of 8
        assert all(v["ms_per_trajectory"] > 0 for v in cells)
    # sync's learner starts after the last event: every call ends after the last verdict
    assert all(set(cell) == {"after_last_verdict"} for cell in data["modes"]["sync"]["by_call_size"].values())
    assert (tmp_path / "learner_calls.png").exists()


@pytest.mark.slow  # two fresh learner processes, one spawning three engines: ~40 s on an idle 2-core box
def test_engine_start_smoke_times_both_start_methods_in_fresh_processes(tmp_path: Path) -> None:
    _load("engine_start").main(["--out", str(tmp_path), "--starts", "1"])
    data = _read(tmp_path, "engine_start")
    assert set(data["methods"]) == {"forkserver", "spawn"}
    for figures in data["methods"].values():
        assert figures["first_start_s"] > 0 and len(figures["later_start_s"]) == 1
        assert figures["rollout_after_kill_s"] > 0 and figures["rollout_s"] > 0
    assert set(data["spawn_over_forkserver"]) == {"first_start", "later_start", "restart"}


@pytest.mark.slow
def test_dynamic_sampling_smoke_runs_both_arms_and_counts_generated_groups(tmp_path: Path) -> None:
    bench = _load("dynamic_sampling")
    bench.main(["--out", str(tmp_path), "--threads", "1", "--seeds", "1", "--max-steps", "2", "--groups", "2",
                "--group-size", "2"])  # fmt: skip
    data = json.loads((tmp_path / "dynamic_sampling.json").read_text())
    assert data["command"] and "load_average_start" in data
    assert [(r["arm"], len(r["steps"])) for r in data["runs"]] == [("off", 2), ("on", 2)]
    for r in data["runs"]:
        for s in r["steps"]:
            assert s["groups_kept"] == s["groups_generated"] - s["groups_dropped"]
            assert s["groups_generated"] == 2 if r["arm"] == "off" else 2 <= s["groups_generated"] <= 4


@pytest.mark.slow  # three receiver processes spawned one after the other: ~50 s on a loaded 2-core box
def test_weight_sync_transport_only_moves_every_tensor_exactly_with_each_transport(tmp_path: Path) -> None:
    import os
    import subprocess

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(BENCH.parent / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    args = ["--transport-only", "--device", "cpu", "--model", "tiny", "--repeats", "1", "--threads", "1"]
    done = subprocess.run(
        [sys.executable, str(BENCH / "weight_sync.py"), *args, "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "weight_sync_transport.json").read_text())

    assert data["mode"] == "transport-only" and data["command"]
    assert set(data["transports"]) == {"file", "ipc", "nccl"}
    assert all(r["exact"] for r in data["transports"].values())
    assert data["transports"]["nccl"]["backend"] == "gloo"
    assert data["ratio_to_file"]["file"] == 1.0
    assert data["transports"]["ipc"]["buckets"] == 1  # a few MB in one 256 MiB bucket


@pytest.mark.container
def test_sandbox_hosts_smoke(tmp_path: Path) -> None:
    from thundersync_lightning.envs.sandbox import find_engine, image_exists

    if find_engine("podman") is None or not image_exists("localhost/thundersync-pytest:latest"):
        pytest.skip("needs podman and the local test image (make test-containers)")
    _load("sandbox_hosts").main(["--rounds", "1", "--commands", "1", "--out", str(tmp_path)])
    data = _read(tmp_path, "sandbox_hosts")
    for side in ("this host", "sandbox host"):
        assert set(data["median_seconds"][side]) == {"open", "command", "verdict", "close"}
    assert set(data["sandbox_host_over_this_host"]) == {"open", "command", "verdict", "close"}
