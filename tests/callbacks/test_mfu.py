import itertools

import pytest
import torch

from tests.callbacks.helpers import StubModule, TinyLM, end_step, record, stats, stub_trainer
from thundersync_lightning.callbacks import MFUMonitor
from thundersync_lightning.callbacks.flops import (
    analytic_step_flops,
    calibrate_matmul_flops,
    resolve_peak_flops,
    transformer_shape,
)
from thundersync_lightning.strategy.stats import Interval

# TinyLM: N_fwd = 4*4 (proj) + 4*10 (untied head) = 56; L=1, H=2, Q=2.
# Trajectories of 4 and 6 tokens, learner_tokens 10:
#   dense     = 6 * 56 * 10                 = 3360
#   attention = 12 * 1 * 2 * 2 * (4^2 + 6^2) = 48 * 52 = 2496
HAND_FLOPS = 3360 + 2496  # 5856


def test_the_analytic_count_matches_a_hand_count():
    shape = transformer_shape(TinyLM())
    assert (shape.matmul_params, shape.trainable_matmul_params) == (56, 56)
    assert (shape.num_layers, shape.num_heads, shape.head_dim) == (1, 2, 2)
    assert analytic_step_flops(shape, 10, [4, 6]) == HAND_FLOPS


def test_a_tied_head_is_counted_once_and_frozen_parameters_skip_their_weight_gradients():
    assert transformer_shape(TinyLM(tie=True)).matmul_params == 56  # the 10x4 table is the head's matmul
    model = TinyLM()
    model.proj.weight.requires_grad_(False)  # like a LoRA base weight
    shape = transformer_shape(model)
    # (4 * 56 + 2 * 40) * 10 + 2496
    assert analytic_step_flops(shape, 10, [4, 6]) == (4 * 56 + 2 * 40) * 10 + 2496


def test_mfu_over_the_step_and_over_busy_time_against_a_hand_count():
    peak = 4.0 * HAND_FLOPS  # FLOP/s of one device
    monitor, trainer, module = MFUMonitor(peak_flops=peak), stub_trainer(), StubModule(model=TinyLM())
    monitor.setup(trainer, module, "fit")
    busy = (Interval(100.5, 100.75, "backward"), Interval(101.0, 101.75, "backward"))  # 1 s busy
    trajs = [record(0, tokens=4), record(1, tokens=6)]
    end_step(monitor, trainer, module, stats(trajs, start=100.0, end=102.0, busy=busy, learner_tokens=10))
    assert module.logged == {
        "perf/model_flops_per_step": 5856.0,
        "perf/model_flops_per_second": 2928.0,  # 5856 / 2 s
        "perf/learner_tokens_per_second": 5.0,  # 10 / 2 s
        "perf/mfu": 0.125,  # 5856 / (2 s * 23424 * 1 device)
        "perf/mfu_busy": 0.25,  # 5856 / (1 busy s * 23424)
    }
    assert monitor.peak.source == "explicit"


def test_the_cpu_peak_is_calibrated_with_the_injected_clock():
    # three timed 8x8 matmuls of 2 * 8^3 = 1024 FLOPs take 0.5, 0.25 and 0.5 s: best 4096 FLOP/s
    ticks = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.5])
    assert calibrate_matmul_flops(torch.device("cpu"), size=8, clock=lambda: next(ticks)) == 4096.0

    clock = itertools.count(step=0.5)  # every matmul "takes" 0.5 s
    monitor = MFUMonitor(clock=lambda: next(clock))
    trainer, module = stub_trainer(), StubModule(model=TinyLM())
    monitor.setup(trainer, module, "fit")
    assert monitor.peak.source == "calibrated"
    assert monitor.peak.flops_per_second == 2 * 1024**3 / 0.5


def test_the_peak_source_is_logged_to_every_logger_as_hyperparameters():
    class Recorder:
        def __init__(self):
            self.params = {}

        def log_hyperparams(self, params):
            self.params.update(params)

    loggers = [Recorder(), Recorder()]
    monitor, trainer = MFUMonitor(peak_flops=1e12), stub_trainer(loggers=loggers)
    monitor.setup(trainer, StubModule(model=TinyLM()), "fit")
    monitor.on_fit_start(trainer, StubModule())
    for lg in loggers:
        assert lg.params == {
            "perf/peak_flops_per_second": 1e12,
            "perf/peak_flops_source": "explicit",
            "perf/peak_flops_device": "cpu",
            "perf/flops_count": "analytic",
        }


def test_without_a_peak_mfu_is_left_out_but_flops_are_logged():
    monitor, trainer, module = MFUMonitor(calibrate_cpu=False), stub_trainer(), StubModule(model=TinyLM())
    monitor.setup(trainer, module, "fit")
    end_step(monitor, trainer, module, stats([record(0, tokens=4)], learner_tokens=4))
    assert monitor.peak.source == "unknown"
    assert "perf/mfu" not in module.logged and module.logged["perf/model_flops_per_step"] > 0


@pytest.mark.filterwarnings("ignore:FLOPs not found")  # Lightning's warning for the unknown GPU
@pytest.mark.parametrize(
    ("name", "dtype", "source", "flops"),
    [
        ("NVIDIA H200", torch.bfloat16, "table", 989.5e12),  # Lightning's table misses the plain name
        ("NVIDIA B200", torch.bfloat16, "table", 2.25e15),
        ("NVIDIA H200 NVL", torch.float16, "table", 835.5e12),
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, "lightning", 989.4e12),
        ("Some Future GPU", torch.bfloat16, "unknown", None),
    ],
)
def test_cuda_peaks_come_from_the_table_for_names_lightning_misses_else_from_lightning(
    monkeypatch, name, dtype, source, flops
):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak = resolve_peak_flops(torch.device("cuda", 0), dtype)
    assert (peak.source, peak.flops_per_second, peak.device_name) == (source, flops, name)


def test_float32_on_the_table_uses_tensor_float32_unless_precision_is_highest(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert resolve_peak_flops(torch.device("cuda", 0), torch.float32).flops_per_second == 494.7e12
        torch.set_float32_matmul_precision("highest")
        assert resolve_peak_flops(torch.device("cuda", 0), torch.float32).flops_per_second == 67e12
    finally:
        torch.set_float32_matmul_precision(previous)


def test_the_measured_count_agrees_with_the_analytic_count_on_a_tiny_qwen3():
    from transformers import AutoModelForCausalLM, Qwen3Config

    from thundersync_lightning.callbacks.flops import MeasuredFlops

    config = Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    lengths = [37, 100]
    analytic = analytic_step_flops(transformer_shape(model), sum(lengths), lengths)
    measured = MeasuredFlops(model).step_flops(lengths)
    # FlopCounterMode skips the elementwise work and the first layer's unneeded input gradient
    assert measured == pytest.approx(analytic, rel=0.02)

    monitor, trainer, module = MFUMonitor(peak_flops=1e9, flops="measured"), stub_trainer(), StubModule(model)
    monitor.setup(trainer, module, "fit")
    end_step(
        monitor, trainer, module, stats([record(0, tokens=37), record(1, tokens=100)], learner_tokens=137)
    )
    assert module.logged["perf/model_flops_per_step"] == measured
