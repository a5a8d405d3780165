"""``thundersync-lightning verify``: one step of sync (recorded) and of streaming (replayed), compared."""

from __future__ import annotations

import pytest
import torch

from thundersync_lightning.cli import main
from thundersync_lightning.verify import (
    BF16_TOLERANCE,
    FP32_TOLERANCE,
    VerifyError,
    gradient_difference,
    precision_of,
)

#: The toy config made small: 4 groups of 4, no simulated verdict latency beyond a few ms.
SMALL = [
    "--config", "configs/toy.yaml",
    "--data.groups_per_step=4", "--data.group_size=4",
    "--data.tasks.init_args.latency_median_s=0.003",
]  # fmt: skip


def verify(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(["verify", *SMALL, *args])
    return int(exit_.value.code), capsys.readouterr().out


def test_verify_passes_on_the_toy_in_fp32_and_reports_the_difference_the_worst_parameter_and_the_kl(capsys):
    status, out = verify(capsys)
    assert status == 0, out
    assert "float32" in out and "PASS" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert float(lines["gradient"].split()[2]) <= FP32_TOLERANCE
    assert "model." in lines["worst"]  # names the parameter
    assert (
        float(lines["engine-learner"].split()[2]) < 1e-6
    )  # the embedded engine samples what the learner scores
    assert int(lines["streaming"].split()[2]) >= 0  # how many gradients streaming held for their rewards


def test_verify_passes_on_a_lora_config_and_compares_only_the_adapters(capsys):
    status, out = verify(capsys, "--model.lora.r=4", "--model.lora.alpha=8")
    assert status == 0, out
    assert "lora_" in next(line for line in out.splitlines() if "worst parameter" in line)


def test_verify_in_bf16_passes_within_the_bf16_bound_and_fails_the_fp32_one(capsys):
    status, out = verify(capsys, "--trainer.precision=bf16-true")
    assert status == 0 and "bfloat16" in out, out
    diff = float(next(line for line in out.splitlines() if "gradient difference" in line).split()[2])
    assert FP32_TOLERANCE < diff <= BF16_TOLERANCE  # 16-bit autograd rounds each trajectory's gradient


def test_a_learner_whose_streaming_gradient_differs_fails_verify_with_status_1(capsys):
    status, out = verify(capsys, "--trainer.strategy=tests.verify_support.SkewedStreamingStrategy")
    assert status == 1, out
    assert "FAIL" in out
    worst = next(line for line in out.splitlines() if "worst parameter" in line)
    assert (
        "embed_tokens" in worst and abs(float(worst.split()[2]) - 1e-2) < 1e-4
    )  # the skewed parameter, by 1%


def test_the_gradient_difference_names_the_worst_parameter_and_counts_a_gradient_where_none_was_due():
    want = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}
    got = {"a": torch.tensor([3.0, 4.5]), "b": torch.tensor([0.0])}
    d = gradient_difference(got, want)
    assert d.relative == pytest.approx(0.5 / 5) and (d.worst_parameter, d.worst_relative) == (
        "a",
        pytest.approx(0.1),
    )
    assert gradient_difference({**got, "b": torch.tensor([1.0])}, want).worst_parameter == "b"  # inf relative


def test_a_zero_reference_gradient_or_different_parameters_cannot_be_verified():
    with pytest.raises(VerifyError, match="gradient is zero"):
        gradient_difference({"a": torch.ones(2)}, {"a": torch.zeros(2)})
    with pytest.raises(VerifyError, match="different parameters"):
        gradient_difference({"a": torch.ones(2)}, {"b": torch.ones(2)})


def test_the_tolerance_follows_the_lowest_precision_in_play():
    assert precision_of("32-true", torch.float32) == "float32"
    assert precision_of("bf16-mixed", torch.float32) == "bfloat16"
    assert precision_of(None, "bfloat16") == "bfloat16"
    assert precision_of("16-mixed", torch.float32) == "float16"
