import torch

from tests.callbacks.helpers import StubModule, end_step, stats, stub_trainer
from thundersync_lightning.callbacks import MemoryMonitor
from thundersync_lightning.callbacks.memory import device_memory, pinned_host_memory
from thundersync_lightning.strategy.stats import AccumulatorBytes


def test_on_cpu_accumulator_bytes_and_rss_are_logged_and_device_keys_are_left_out():
    monitor, trainer, module = MemoryMonitor(), stub_trainer(), StubModule()
    monitor.setup(trainer, module, "fit")
    acc = AccumulatorBytes(device=1024, pinned_host=0, pageable_host=4096)
    end_step(monitor, trainer, module, stats(accumulator=acc))
    rss = module.logged.pop("memory/process_rss_bytes")
    assert rss > 10 * 2**20  # a Python process with torch loaded holds well over 10 MiB
    assert module.logged == {
        "memory/accumulator_device_bytes": 1024.0,
        "memory/accumulator_pinned_host_bytes": 0.0,
        "memory/accumulator_pageable_host_bytes": 4096.0,
        "memory/accumulator_total_bytes": 5120.0,
    }


def test_cuda_peaks_are_read_from_the_caching_allocator_and_reset_when_a_step_starts(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4 * 2**30)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(device))
    cuda = torch.device("cuda", 0)
    assert device_memory(cuda) == {
        "memory/peak_device_bytes": float(3 * 2**30),
        "memory/peak_device_reserved_bytes": float(4 * 2**30),
    }
    assert device_memory(torch.device("cpu")) == {}
    MemoryMonitor().on_train_batch_start(stub_trainer(), StubModule(device=cuda), None, 0)
    assert calls == [cuda]


def test_pinned_host_memory_comes_from_the_host_allocator_stats(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda,
        "host_memory_stats",
        lambda: {"active_bytes.current": 512, "allocated_bytes.current": 2048},
    )
    assert pinned_host_memory() == {
        "memory/pinned_host_bytes": 512.0,
        "memory/pinned_host_reserved_bytes": 2048.0,
    }
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pinned_host_memory() == {}
