"""Overlapped pinned offload: the ordering of copies, waits and host reads, checked on CPU.

A fake copy engine stands in for the side CUDA stream. It poisons a copy's destination when the
copy starts and moves the data only when someone waits on it (the latest a real copy may land),
reading the source at that moment. So a host read before the wait sees NaN, and a staging buffer
overwritten before the copy read it delivers the wrong gradient: either breaks the exact sums.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thundersync_lightning.core import ConfigError, StreamingGRPO
from thundersync_lightning.core.accumulator.group import GroupSums
from thundersync_lightning.core.accumulator.step_gradient import StepGradient
from thundersync_lightning.core.gradients.storage import GradientStore


class DelayedCopies:
    """Copies that land only when waited on; ``log`` records every operation in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self._in_flight: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> int:
        ticket = sum(1 for kind, _ in self.log if kind == "copy")
        dst.fill_(float("nan"))  # undefined until it lands
        self._in_flight[ticket] = (dst, src)
        self.log.append(("copy", ticket))
        return ticket

    def _land(self, ticket: int) -> None:
        if ticket in self._in_flight:
            dst, src = self._in_flight.pop(ticket)
            dst.copy_(src)

    def wait_on_compute(self, ticket: int) -> None:
        self.log.append(("compute waits", ticket))
        self._land(ticket)

    def synchronize(self, ticket: int) -> None:
        self.log.append(("host waits", ticket))
        self._land(ticket)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


def params() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(3, 4, requires_grad=True), torch.randn(5, requires_grad=True)]


def grads(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]


def folded(store: GradientStore, events: list[tuple[str, int, float]], a: float, b: float) -> torch.Tensor:
    """One group through GroupSums: ``sum`` adds a gradient with a known reward, ``held`` holds one and
    then hands it to the sums; the group is folded into a step gradient and that gradient returned."""
    group = GroupSums(members=tuple(range(len(events))))
    step = StepGradient(store)
    held = []
    for kind, seed, reward in events:
        if kind == "sum":
            group.accumulate(store, reward, grads=grads(seed))
        else:
            held.append((store.flatten(grads(seed)), reward))
    for flat, reward in held:
        group.accumulate(store, reward, flat=flat)
    group.fold_into(step.scaled(), store, a, b)
    group.drop(store)
    return step.scaled().clone()


events = st.lists(
    st.tuples(st.sampled_from(["sum", "held"]), st.integers(0, 10**6), st.sampled_from([0.0, 1.0, 0.5, 2.0])),
    min_size=1,
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(events=events, a=st.floats(-2, 2), b=st.floats(-2, 2))
def test_overlapped_pinned_sums_equal_the_synchronous_ones_bit_for_bit(events, a, b):
    ps = params()
    want = folded(GradientStore(ps, "none"), events, a, b)
    copies = DelayedCopies()
    store = GradientStore(ps, "pinned", copies=copies)
    got = folded(store, events, a, b)
    assert torch.equal(got, want)
    assert copies.in_flight == 0  # every copy was waited on before its buffer was read or released
    assert store.current().pinned_host == 0


def test_the_next_gradient_is_staged_while_the_previous_copy_is_in_flight():
    copies = DelayedCopies()
    store = GradientStore(params(), "pinned", copies=copies)
    store.flatten(grads(0))
    store.flatten(grads(1))  # the other staging buffer: no wait for copy 0
    assert copies.log == [("copy", 0), ("copy", 1)]
    store.flatten(grads(2))  # staging buffer 0 again: the compute stream waits for copy 0 first
    assert copies.log[2:] == [("compute waits", 0), ("copy", 2)]


def test_a_host_buffer_is_read_and_released_only_after_its_copy_landed():
    copies = DelayedCopies()
    store = GradientStore(params(), "pinned", copies=copies)
    held = store.flatten(grads(0))
    on_device = store.to_device(held)  # the host waits for copy 0 before reading
    assert copies.log == [("copy", 0), ("host waits", 0)]
    assert torch.equal(on_device, torch.cat([g.reshape(-1) for g in grads(0)]))
    other = store.flatten(grads(1))
    store.release(other)
    assert copies.log[-1] == ("host waits", 1)


def test_adds_into_a_host_sum_are_applied_in_order_when_their_landing_buffer_is_reused():
    copies = DelayedCopies()
    store = GradientStore(params(), "pinned", copies=copies)
    total = store.flatten(grads(0))
    store.add_grads(total, grads(1))  # landing buffer 1 (staging 1)
    store.add_grads(total, grads(2), alpha=2.0)  # landing buffer 0: deferred, copy 2 in flight
    assert ("host waits", 1) not in copies.log  # nothing has been applied on the host yet
    store.add_grads(total, grads(3))  # landing buffer 1 again: the add of copy 1 is applied first
    assert copies.log.index(("host waits", 1)) < copies.log.index(("copy", 3))
    plain = GradientStore(params(), "none")
    want = plain.flatten(grads(0))
    for seed, alpha in ((1, 1.0), (2, 2.0), (3, 1.0)):
        plain.add_grads(want, grads(seed), alpha)
    assert torch.equal(store.to_device(total), want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build's refusal")
def test_pinned_offload_is_refused_on_a_cpu_only_build():
    with pytest.raises(ConfigError, match="offload='pinned' needs page-locked host memory"):
        StreamingGRPO(params(), offload="pinned")


@settings(max_examples=30, deadline=None)
@given(events=events, a=st.floats(-2, 2), b=st.floats(-2, 2))
def test_a_reserved_store_allocates_nothing_in_a_step_and_sums_the_same(events, a, b):
    ps = params()
    want = folded(GradientStore(ps, "none"), events, a, b)
    store = GradientStore(ps, "pinned", copies=DelayedCopies())
    store.reserve(len(events) + 1)  # one buffer per trajectory at most, and the group's first sum
    assert store.reserved == len(events) + 1 and store.current().pinned_host == 0  # not in use yet

    allocate = store._new

    def refuse(where: str) -> torch.Tensor:
        assert where == "device", f"a {where} buffer was allocated during the step"
        return allocate(where)  # the step's gradient: on the device, from the caching allocator

    store._new = refuse  # landing and every host buffer came from the reservation
    assert torch.equal(folded(store, events, a, b), want)


@pytest.mark.parametrize("offload, reserved", [("cpu", 2 * 3 + 4), ("none", 0)])
def test_the_accumulator_reserves_the_host_buffers_both_bounds_allow(offload, reserved):
    acc = StreamingGRPO(params(), offload=offload, max_open_groups=3, max_held_trajectories=4)
    assert acc._store.reserved == reserved
    assert StreamingGRPO(params(), offload=offload, max_open_groups=3)._store.reserved == 0  # held unbounded
