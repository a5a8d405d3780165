"""ZeRO-1 and FSDP2 on 2 gloo processes train the parameters of plain data parallelism.

Each launch runs several fits on one process group (tests/strategy/sharding_script.py); every
rank reports the full parameters afterwards and the optimizer state it holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.strategy import ThunderSyncStrategy
from thundersync_lightning.strategy.sharding import ZeRO1, shard_units

from ._fit import TOY_MODEL, fit, relative

SCRIPT = Path(__file__).with_name("sharding_script.py")


def _launch(out: Path, *runs: str) -> dict[str, list[dict]]:
    """{run: [rank 0's result, rank 1's result]}."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "2", *runs],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {run: [torch.load(out / f"{run.replace('/', '-')}.rank{r}.pt") for r in (0, 1)] for run in runs}


@pytest.fixture(scope="module")
def streaming(tmp_path_factory) -> dict[str, list[dict]]:
    runs = ("streaming/none", "streaming/zero1", "streaming/fsdp2", "uneven/fsdp2")
    return _launch(tmp_path_factory.mktemp("streaming"), *runs)


@pytest.mark.parametrize("sharding", ["zero1", "fsdp2"])
def test_sharded_streaming_on_two_ranks_gives_the_parameters_of_plain_data_parallel(streaming, sharding):
    plain, sharded = streaming["streaming/none"], streaming[f"streaming/{sharding}"]
    assert [r["world_size"] for r in sharded] == [2, 2]
    for rank in (0, 1):
        assert set(sharded[rank]["staleness"]) == {0}
        assert relative(sharded[rank]["params"], plain[0]["params"]) <= 1e-5


@pytest.mark.parametrize("sharding", ["zero1", "fsdp2"])
def test_each_rank_holds_part_of_the_optimizer_state(streaming, sharding):
    plain, sharded = streaming["streaming/none"], streaming[f"streaming/{sharding}"]
    # AdamW: two moments per trainable tensor (25 tensors in the toy Qwen3), every one on every plain rank
    assert plain[0]["state_tensors"] == plain[1]["state_tensors"] == 2 * 25
    for rank in (0, 1):
        assert 0 < sharded[rank]["state_bytes"] < plain[rank]["state_bytes"]
    # nothing lost, nothing twice: the shards add up to one full copy
    assert sharded[0]["state_bytes"] + sharded[1]["state_bytes"] == plain[0]["state_bytes"]
    if sharding == "zero1":  # whole tensors per rank
        assert sharded[0]["state_tensors"] + sharded[1]["state_tensors"] == plain[0]["state_tensors"]


@pytest.mark.slow  # ten fits with their engine start-ups
def test_sharded_sync_async_cut_and_clipped_runs_give_the_parameters_of_plain_data_parallel(tmp_path):
    runs = ["sync/none", "sync/zero1", "sync/fsdp2", "async/none", "async/zero1", "async/fsdp2"]
    runs += [
        "streaming/none",
        "streaming/fsdp2/cut",
        "streaming/none/clip",
        "streaming/zero1/clip",
        "streaming/fsdp2/clip",
    ]
    results = _launch(tmp_path, *runs)
    for run in runs:
        mode, sharding, *extra = run.split("/")
        baseline = results["/".join([mode, "none", *(e for e in extra if e == "clip")])][0]["params"]
        assert relative(results[run][0]["params"], baseline) <= 1e-5, run
        assert relative(results[run][1]["params"], baseline) <= 1e-5, run
        allowed = {0, 1} if mode == "async" else {0}
        assert set(results[run][0]["staleness"]) <= allowed, run


@pytest.mark.slow  # four fits
@pytest.mark.parametrize("sharding", ["zero1", "fsdp2"])
def test_resuming_a_sharded_run_from_its_checkpoint_reproduces_the_uninterrupted_run(tmp_path, sharding):
    result = _launch(tmp_path, f"resume/{sharding}")[f"resume/{sharding}"]
    assert result[0]["steps"] == [2, 3]
    assert result[0]["saved_state_entries"] == 25  # every rank's state is in the file: all 25 tensors
    for rank in (0, 1):
        assert relative(result[rank]["params"], result[rank]["uninterrupted"]) <= 1e-5


def test_fsdp2_reduce_scatters_uneven_rows_into_the_shards_and_catches_a_reshard_during_the_step(streaming):
    rank0, rank1 = streaming["uneven/fsdp2"]
    # torch.chunk layout: 5 rows -> 3 + 2, 1 row -> 1 + 0, 3 rows -> 2 + 1
    assert rank0["rows"]["net.0.weight"] == 3 and rank1["rows"]["net.0.weight"] == 2
    assert rank0["rows"]["net.2.weight"] == 1 and rank1["rows"]["net.2.weight"] == 0
    for result in (rank0, rank1):
        assert result["grads_match"] and result["full_grads_freed"] and result["reshard_caught"]


# ---------------------------------------------------------------------- one process


def test_an_unknown_sharding_is_a_config_error_listing_the_valid_ones():
    with pytest.raises(ConfigError, match=r"sharding='zero3' is not one of \('none', 'zero1', 'fsdp2'\)"):
        ThunderSyncStrategy(sharding="zero3")


def test_fsdp2_in_one_process_is_refused_before_anything_starts_naming_the_fix():
    with pytest.raises(ConfigError, match=r"sharding='fsdp2'.*devices >= 2"):
        fit(strategy_kwargs={"sharding": "fsdp2"})


def test_fsdp2_wraps_each_transformer_block_then_the_model_and_leaves_frozen_children_replicated():
    from thundersync_lightning.modules import GRPOPolicy

    policy = GRPOPolicy(config=TOY_MODEL, objective={"kl_coef": 0.1})  # a frozen reference copy
    layers = policy.model.model.layers
    assert shard_units(policy) == [layers[0], layers[1], policy.model]


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_zero1_keeps_parameter_groups_and_the_lr_scheduler_working(one_rank_group):
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    adamw = torch.optim.AdamW([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.StepLR(adamw, step_size=1, gamma=0.5)
    config = type("Config", (), {"scheduler": scheduler})()
    [zero] = ZeRO1(distributed=True).wrap_optimizers([adamw], [config])
    assert scheduler.optimizer is zero
    assert [g["lr"] for g in zero.param_groups] == [0.1, 0.5]
    assert [g["initial_lr"] for g in zero.param_groups] == [0.1, 0.5]
    a.grad, b.grad = torch.ones(3), torch.ones(2)
    zero.step()
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error"
        )  # no "lr_scheduler.step() before optimizer.step()": the step was tracked
        scheduler.step()
    assert [g["lr"] for g in zero.param_groups] == [0.05, 0.25]
    assert torch.allclose(a.detach(), torch.full((3,), 0.9))  # AdamW's first step moves by lr


def test_the_yaml_key_strategy_init_args_sharding_takes_the_three_layouts_and_nothing_else():
    from thundersync_lightning.cli import build_parser

    toy = str(Path(__file__).resolve().parents[2] / "configs" / "toy.yaml")
    parser = build_parser()
    for sharding in ("none", "zero1", "fsdp2"):
        config = parser.parse_args(["--config", toy, f"--trainer.strategy.init_args.sharding={sharding}"])
        assert config.trainer.strategy.init_args.sharding == sharding
    with pytest.raises(SystemExit):
        parser.parse_args(["--config", toy, "--trainer.strategy.init_args.sharding=zero3"])
