"""The bucketed weight transports on CPU: gloo where NCCL would run, the shared-file stand-in where
CUDA IPC would. Sender and receivers run in threads of this process (each its own group member)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from thundersync_lightning.core.errors import EngineError
from thundersync_lightning.rollout.weights.transport import (
    ALIGN,
    TransferAborted,
    WeightReceiver,
    WeightSender,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)

TRANSPORTS = ("ipc", "nccl")


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed": torch.randn(50, 8, generator=g),  # 1600 B
        "norm": torch.randn(8, generator=g).to(torch.bfloat16),  # 16 B
        "proj": torch.randn(3, 5, generator=g).to(torch.float64),  # 120 B
        "big": torch.randn(700, generator=g),  # 2800 B: larger than a 2048 B bucket
        "bias": torch.randint(0, 9, (3,), generator=g),  # int64, 24 B
    }


def test_buckets_keep_the_state_dict_order_and_stay_within_the_bound_unless_one_tensor_is_larger():
    weights = state(0)
    buckets = plan_buckets(weights, bucket_bytes=2048)

    assert [s.name for b in buckets for s in b.slots] == list(weights)
    for b in buckets:
        assert b.nbytes <= 2048 or len(b.slots) == 1
        assert all(s.offset % ALIGN == 0 for s in b.slots)
    # embed 1600 B; norm at 1600; proj at 1664 (aligned) ends 1784; big alone; bias alone after big
    assert [[s.name for s in b.slots] for b in buckets] == [["embed", "norm", "proj"], ["big"], ["bias"]]


def test_a_bucket_unpacks_to_the_exact_tensors_packed_into_it():
    weights = state(1)
    for bucket in plan_buckets(weights, bucket_bytes=4096):
        buffer = torch.zeros(bucket.nbytes, dtype=torch.uint8)
        pack_bucket(weights, bucket, buffer)
        for name, tensor in unpack_bucket(buffer, bucket):
            assert tensor.dtype == weights[name].dtype
            assert torch.equal(tensor, weights[name])


def test_a_bucket_size_below_one_byte_is_refused():
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(state(0), 0)


class Group:
    """One sender and ``receivers`` receivers, each receiver serving one publish per call."""

    def __init__(self, transport: str, receivers: int = 1) -> None:
        self.sender = WeightSender(transport, receivers=receivers, device_type="cpu", timeout_s=30)  # type: ignore[arg-type]
        members: list[WeightReceiver] = []
        joins = [
            threading.Thread(target=lambda r=r: members.append(WeightReceiver(self.sender.join_info, r)))
            for r in range(1, receivers + 1)
        ]
        for t in joins:
            t.start()
        self.sender.connect()
        for t in joins:
            t.join()
        self.receivers = members

    def publish(
        self, weights: Any, consume: Callable[[Iterator[Any]], Any] | None = None, bucket_bytes: int = 2048
    ) -> tuple[list[Any], BaseException | None]:
        """Send ``weights``; returns each receiver's result (or exception) and the sender's error."""
        info = self.sender.prepare(weights, bucket_bytes)
        results: list[Any] = [None] * len(self.receivers)

        def serve(k: int, member: WeightReceiver) -> None:
            try:
                results[k] = member.receive_into(
                    info, consume or (lambda pairs: {n: t.clone() for n, t in pairs})
                )
            except BaseException as exc:
                results[k] = exc

        threads = [threading.Thread(target=serve, args=(k, m)) for k, m in enumerate(self.receivers)]
        for t in threads:
            t.start()
        error = None
        try:
            self.sender.send(weights, info)
        except BaseException as exc:
            error = exc
        for t in threads:
            t.join()
        return results, error

    def close(self) -> None:
        self.sender.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_receiver_gets_every_tensor_exactly_in_the_state_dict_order(transport):
    group = Group(transport, receivers=2)
    try:
        for seed in (0, 1):  # the second publish reuses the group (and the ipc buffer)
            weights = state(seed)
            results, error = group.publish(weights)
            assert error is None
            for got in results:
                assert list(got) == list(weights)
                assert all(torch.equal(got[n], weights[n]) for n in weights)
    finally:
        group.close()


class FailsAt(dict):
    """A state dict whose tensor ``bad`` cannot be read (a learner-side failure mid-publish)."""

    def __init__(self, weights: dict[str, torch.Tensor], bad: str) -> None:
        super().__init__(weights)
        self.bad = bad

    def __getitem__(self, name: str) -> torch.Tensor:
        if name == self.bad:
            raise RuntimeError(f"cannot read {name}")
        return super().__getitem__(name)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_learner_failing_half_way_aborts_every_receiver_and_the_next_publish_succeeds(transport):
    group = Group(transport)
    try:
        seen: list[str] = []

        def consume(pairs: Iterator[Any]) -> None:
            for name, _ in pairs:
                seen.append(name)

        results, error = group.publish(FailsAt(state(0), "big"), consume)
        assert isinstance(error, RuntimeError) and "cannot read big" in str(error)
        assert isinstance(results[0], TransferAborted) and "bucket 1 of 3" in str(results[0])
        assert seen == ["embed", "norm", "proj"]  # bucket 0 arrived before the abort

        weights = state(1)
        results, error = group.publish(weights)
        assert error is None and all(torch.equal(results[0][n], weights[n]) for n in weights)
    finally:
        group.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_receiver_failing_half_way_keeps_the_sender_in_lockstep_and_raises_its_own_error(transport):
    group = Group(transport)
    try:

        def consume(pairs: Iterator[Any]) -> None:
            for name, _ in pairs:
                if name == "big":
                    raise ValueError("load_weights failed")

        results, error = group.publish(state(0), consume)
        assert error is None  # the sender finished: the receiver drained the remaining buckets
        assert isinstance(results[0], ValueError)

        weights = state(2)
        results, error = group.publish(weights)
        assert error is None and all(torch.equal(results[0][n], weights[n]) for n in weights)
    finally:
        group.close()


def test_sending_before_the_receivers_joined_is_refused():
    sender = WeightSender("nccl", receivers=1, device_type="cpu", timeout_s=5)
    with pytest.raises(EngineError, match="connect"):
        sender.prepare(state(0), 2048)
    sender.close()


def test_an_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="'ipc' or 'nccl'"):
        WeightSender("file", receivers=1, device_type="cpu", timeout_s=5)  # type: ignore[arg-type]
