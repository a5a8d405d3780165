"""Every shipped config's memory plan fits the machine its header states, and ``plan`` prints it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from thundersync_lightning.cli import build_parser, config_plan, main
from thundersync_lightning.planning.memory_plan import parse_bytes

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
TARGET = re.compile(r"^# memory plan target \(.*\): (.+)$", re.M)


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def target(path: Path) -> dict[str, int]:
    """The ``--device_memory=... --host_memory=...`` a config's header states it is sized for."""
    found = TARGET.search(path.read_text())
    assert found, (
        f"{path.name} states no '# memory plan target (...): --device_memory=... --host_memory=...' line"
    )
    return {
        k.lstrip("-"): parse_bytes(v) for k, v in (arg.split("=", 1) for arg in shlex.split(found.group(1)))
    }


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_fits_the_machine_its_header_states(parser, path, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    args = ["--config", str(path)]
    if (
        path.name == "tool_learn.yaml"
    ):  # its starting policy is built by `make demo-tools`: a one-step stand-in
        from thundersync_lightning.envs.branches.start import build_start

        build_start(str(tmp_path), steps=1, samples=1)
        args += [f"--model.pretrained_path={tmp_path}", f"--data.tasks.init_args.tokenizer_path={tmp_path}"]
    plan = config_plan(parser.parse_args(args).as_dict())
    machine = target(path)
    host = machine["host_memory"]
    device = machine.get("device_memory", host if plan.inputs.accelerator == "cpu" else 0)
    assert plan.inputs.accelerator == ("gpu" if "device_memory" in machine else "cpu"), path.name
    verdict = plan.fits(device, host)
    assert verdict.fits, f"{path.name}:\n{verdict.message()}\n{plan.table()}"


def test_the_swebench_config_is_planned_as_lora_on_qwen3_8b(parser, monkeypatch):
    monkeypatch.chdir(ROOT)
    plan = config_plan(parser.parse_args(["--config", "configs/swebench.yaml"]).as_dict())
    assert plan.inputs.model.lora and 8.1e9 < plan.inputs.model.total_params < 8.3e9  # the published Qwen3-8B
    assert plan.inputs.model.trainable_params < 0.01 * plan.inputs.model.total_params


def test_plan_prints_the_table_and_exits_1_naming_the_fix_when_it_does_not_fit(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as done:
        main(["plan", "--config", "configs/swebench.yaml", "--device_memory=60GiB", "--host_memory=256GiB"])
    out = capsys.readouterr().out
    assert done.value.code == 1
    assert "activations" in out and "group sums" in out and "DOES NOT FIT" in out
    assert "any of these would make it fit" in out


def test_plan_reads_the_same_overrides_as_fit(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as done:
        main(
            [
                "plan",
                "--config",
                "configs/toy.yaml",
                "--host_memory=4GiB",
                "--trainer.strategy.init_args.max_open_groups=3",
                "--data.group_size=2",
            ]
        )
    out = capsys.readouterr().out
    assert done.value.code == 0 and "FITS" in out
    assert "3 open groups (max_open_groups=3), 6 held trajectories" in out


def test_plan_resolves_an_automatic_call_size_for_the_machine_it_is_given(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as done:  # the toy step: 16 groups of 8, the tiny model fits whole
        main(["plan", "--config", "configs/toy.yaml", "--host_memory=4GiB"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "max_batch_trajectories='auto': 128 trajectories per learner call" in out
    with pytest.raises(SystemExit) as done:  # a number is planned as given
        main(["plan", "--config", "configs/toy.yaml", "--host_memory=4GiB",
              "--trainer.strategy.init_args.max_batch_trajectories=8"])  # fmt: skip
    assert done.value.code == 0 and "'auto'" not in capsys.readouterr().out


def test_plan_reads_the_token_cap_and_the_policys_padding_options(parser, monkeypatch):
    monkeypatch.chdir(ROOT)
    base = ["--config", "configs/gpu_1x.yaml", "--trainer.strategy.init_args.max_batch_trajectories=4"]
    plain = config_plan(
        parser.parse_args(base + ["--trainer.strategy.init_args.max_batch_tokens=null"]).as_dict()
    )
    capped = config_plan(parser.parse_args(
        base + ["--trainer.strategy.init_args.max_batch_tokens=2500", "--model.score_max_padding=0.5",
                "--model.score_forward_tokens=8"]).as_dict())  # fmt: skip
    i, rows = capped.inputs, plain.inputs
    assert (i.max_batch_tokens, i.score_max_padding, i.score_forward_tokens) == (2500, 0.5, 8)
    assert (rows.max_batch_tokens, rows.score_max_padding, rows.score_forward_tokens) == (None, 0.25, 64)
    t = i.max_tokens_per_trajectory  # 2048: 4 rows plain, 1.5 x 2500 + 8 x 2 under the cap
    per_token = plain.row("activations").device // (4 * t)
    assert capped.row("activations").device == (int(1.5 * 2500) + 8 * 2) * per_token < 4 * t * per_token


def test_the_gpu_configs_token_caps_plan_the_activations_their_row_caps_did(parser, monkeypatch):
    # each shipped GPU config bounds a call by tokens at no more planned memory than its old row cap
    monkeypatch.chdir(ROOT)
    for name, old_rows in (("gpu_1x", 2), ("gpu_vllm_example", 2), ("swebench", 1)):
        args = ["--config", f"configs/{name}.yaml"]
        capped = config_plan(parser.parse_args(args).as_dict())
        rows = config_plan(parser.parse_args(args + [
            "--trainer.strategy.init_args.max_batch_tokens=null",
            f"--trainer.strategy.init_args.max_batch_trajectories={old_rows}"]).as_dict())  # fmt: skip
        assert capped.inputs.max_batch_tokens is not None and capped.inputs.max_batch_trajectories == 8, name
        assert capped.row("activations").device <= rows.row("activations").device, name


@pytest.mark.slow  # builds eight Qwen3 architectures on the meta device (~15 s of CPU)
def test_the_memory_table_in_docs_scaling_is_the_planners_output():
    import importlib.util

    spec = importlib.util.spec_from_file_location("scaling_table", ROOT / "benchmarks" / "scaling_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    doc = (ROOT / "docs" / "scaling.md").read_text()
    assert module.table() in doc, "docs/scaling.md is stale: run python benchmarks/scaling_table.py --write"
    assert "## Multi-node" in doc and "## Sharding" in doc


def test_a_device_size_for_another_machine_checks_its_host_only_when_given_and_the_table_has_a_legend(
    capsys, monkeypatch
):
    import thundersync_lightning.cli as cli

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(cli.psutil, "virtual_memory", lambda: type("Free", (), {"available": 2**30})())
    with pytest.raises(
        SystemExit
    ) as done:  # this machine's 1 GiB of free RAM says nothing of the target's host
        main(["plan", "--config", "configs/gpu_1x.yaml", "--device_memory=80GB"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "FITS" in out and "host memory not checked: pass --host_memory" in out
    assert re.search(r"host: needs [\d.]+ GiB \(not checked\)", out)
    assert re.search(
        r"^sized as: P = [\d,]+ parameters, P_t = [\d,]+ trainable, e = 2 bytes per weight", out, re.M
    )
    with pytest.raises(SystemExit) as done:
        main(["plan", "--config", "configs/gpu_1x.yaml", "--device_memory=80GB", "--host_memory=32GiB"])
    assert done.value.code == 1 and "host: needs" in capsys.readouterr().out
