"""Weight transports without files: a state dict moves from the learner into other processes in
bounded buckets, through shared device memory (``ipc``) or a broadcast (``nccl``).

Notation: W the state dict in its own order, B the bucket size in bytes (``bucket_bytes``).
Buckets cut W, in order, into runs whose packed bytes (each tensor aligned to ``ALIGN``) stay
within B; a tensor larger than B gets a bucket of its own. The extra memory of a publish is
therefore one bucket on each side, ``max(B, largest tensor)`` (the memory plan's "weight sync"
row, :mod:`~thundersync_lightning.planning.memory_plan`), never a second copy of W.

Group: the learner (rank 0) and R receivers (ranks 1..R, e.g. vLLM's tensor-parallel workers)
join a process group of their own, a ``TCPStore`` the learner serves plus a gloo (CPU) or NCCL
(CUDA) backend created directly, so no global ``torch.distributed`` state is touched on either
side (as vLLM's ``stateless_init_torch_distributed_process_group`` does).

Protocol, per bucket k in order (both transports):

1. the learner broadcasts a header ``[status, k]``; status 0 means "aborted": the learner failed
   packing bucket k (a bad tensor) and the receivers raise :class:`TransferAborted`;
2. ``nccl``: the learner broadcasts the packed bucket; each receiver receives it into a fresh
   buffer and yields views of it (nothing reuses that buffer);
   ``ipc``: the learner has packed the bucket into one shared buffer whose handle the receivers
   opened; each receiver clones its views out, then every rank meets at a barrier so that the
   learner may overwrite the buffer with bucket k + 1.

Invariant: sender and receivers stay in lockstep whatever fails. A receiver whose consumer
raises (vLLM's ``load_weights``) keeps taking part in the remaining buckets without using them
(:meth:`WeightReceiver.receive_into`), then re-raises; a learner that fails mid-way sends the
abort header. Either way the publish fails on both sides and the group stays usable.

Shared buffer handles: on CUDA, ``torch.multiprocessing.reductions.reduce_tensor`` (a CUDA IPC
handle; the receiver opens it on its own current device, as vLLM's colocated RLHF example does);
on CPU, a stand-in that runs the same bucketing and ordering code: a file in ``/dev/shm``
memory-mapped by both sides (``torch.from_file(shared=True)``).

This module never imports vLLM (``benchmarks/weight_sync.py --transport-only`` runs it alone).
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor

from ...core.errors import EngineError

__all__ = [
    "ALIGN",
    "Bucket",
    "JoinInfo",
    "PublishInfo",
    "Slot",
    "TransferAborted",
    "Transport",
    "WeightReceiver",
    "WeightSender",
    "join_from_json",
    "join_to_json",
    "pack_bucket",
    "plan_buckets",
    "publish_from_json",
    "publish_to_json",
    "unpack_bucket",
]

Transport = Literal["ipc", "nccl"]
ALIGN = 64  # bytes: every slot starts at a multiple, so a uint8 view re-views as any dtype


class TransferAborted(EngineError):
    """The learner aborted a publish half-way (it could not pack a bucket)."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One tensor inside a bucket: ``nbytes`` bytes at ``offset`` of the packed uint8 buffer."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Bucket:
    slots: tuple[Slot, ...]
    nbytes: int  # packed size, alignment included


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_buckets(weights: Mapping[str, Tensor], bucket_bytes: int) -> tuple[Bucket, ...]:
    """Cut ``weights`` in order into buckets of at most ``bucket_bytes`` packed bytes (a larger
    tensor alone in its own). Every name appears in exactly one slot, in the mapping's order."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    end = 0
    for name, tensor in weights.items():
        nbytes = tensor.numel() * tensor.element_size()
        start = _aligned(end)
        if slots and start + nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(slots), end))
            slots, start = [], 0
        slots.append(Slot(name, tensor.dtype, tuple(tensor.shape), start, nbytes))
        end = start + nbytes
    if slots:
        buckets.append(Bucket(tuple(slots), end))
    return tuple(buckets)


def pack_bucket(weights: Mapping[str, Tensor], bucket: Bucket, out: Tensor) -> None:
    """Copy the bucket's tensors into the uint8 buffer ``out`` (any device; at least ``bucket.nbytes``)."""
    for slot in bucket.slots:
        tensor = weights[slot.name].detach()
        if tensor.dtype != slot.dtype or tuple(tensor.shape) != slot.shape:
            raise EngineError(
                f"{slot.name} changed from {slot.dtype} {slot.shape} to {tensor.dtype} {tuple(tensor.shape)} "
                "during a publish"
            )
        flat = tensor.contiguous().reshape(-1).view(torch.uint8)
        out[slot.offset : slot.offset + slot.nbytes].copy_(flat, non_blocking=True)


def unpack_bucket(buffer: Tensor, bucket: Bucket) -> list[tuple[str, Tensor]]:
    """Views of ``buffer`` (uint8), one per slot, with the slot's dtype and shape."""
    return [
        (s.name, buffer[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)) for s in bucket.slots
    ]


@dataclass(frozen=True, slots=True)
class JoinInfo:
    """What a receiver needs to join the learner's group (picklable: it travels by RPC)."""

    transport: Transport
    host: str
    port: int
    world_size: int
    device_type: str  # "cuda": NCCL and CUDA IPC; "cpu": gloo and the shared-file stand-in
    timeout_s: float
    group: str


@dataclass(frozen=True, slots=True)
class PublishInfo:
    """One publish's layout (and, for ``ipc``, the shared buffer's handle)."""

    buckets: tuple[Bucket, ...]
    handle: Any = None


# -- JSON wire form (vLLM's HTTP ``/collective_rpc`` passes string arguments only; no pickle
# crosses the network) ------------------------------------------------------------------------


def join_to_json(join: JoinInfo) -> str:
    return json.dumps(
        {"transport": join.transport, "host": join.host, "port": join.port, "world_size": join.world_size,
         "device_type": join.device_type, "timeout_s": join.timeout_s, "group": join.group}
    )  # fmt: skip


def join_from_json(text: str) -> JoinInfo:
    """The :class:`JoinInfo` of :func:`join_to_json`; raises :class:`EngineError` on anything else."""
    try:
        d = json.loads(text)
        join = JoinInfo(
            str(d["transport"]), str(d["host"]), int(d["port"]), int(d["world_size"]),  # type: ignore[arg-type]
            str(d["device_type"]), float(d["timeout_s"]), str(d["group"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"malformed weight-transfer join message: {exc}") from exc
    if join.transport != "nccl" or join.device_type not in ("cpu", "cuda"):
        raise EngineError(f"a join over the network takes transport 'nccl' on cpu or cuda, got {join}")
    return join


def publish_to_json(info: PublishInfo) -> str:
    """The bucket layout of an ``nccl`` publish (no buffer handle: nothing is shared across hosts)."""
    if info.handle is not None:
        raise ValueError("an ipc publish (a shared-buffer handle) does not cross the network")
    return json.dumps([
        {"nbytes": b.nbytes,
         "slots": [[s.name, str(s.dtype).removeprefix("torch."), list(s.shape), s.offset, s.nbytes]
                   for s in b.slots]}
        for b in info.buckets
    ])  # fmt: skip


def publish_from_json(text: str) -> PublishInfo:
    """The :class:`PublishInfo` of :func:`publish_to_json`; raises :class:`EngineError` on anything else."""
    try:
        buckets = []
        for bucket in json.loads(text):
            parsed = []
            for name, dtype, shape, offset, size in bucket["slots"]:
                kind = getattr(torch, str(dtype), None)
                if not isinstance(kind, torch.dtype):
                    raise ValueError(f"unknown dtype {dtype!r}")
                parsed.append(Slot(str(name), kind, tuple(int(n) for n in shape), int(offset), int(size)))
            buckets.append(Bucket(tuple(parsed), int(bucket["nbytes"])))
    except (ValueError, TypeError, KeyError) as exc:
        raise EngineError(f"malformed weight-transfer publish message: {exc}") from exc
    return PublishInfo(tuple(buckets))


def _backend(store: dist.Store, rank: int, size: int, device_type: str, timeout_s: float) -> Any:
    timeout = datetime.timedelta(seconds=timeout_s)
    if device_type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _device(device_type: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")


class _Member:
    """One rank of the transfer group: header and payload collectives, rank 0 the root."""

    def __init__(self, join: JoinInfo, rank: int, store: dist.Store) -> None:
        self.join = join
        self.rank = rank
        self.device = _device(join.device_type)
        # the group's backend only talks through this prefix of the store
        self._pg = _backend(
            dist.PrefixStore(join.group, store), rank, join.world_size, join.device_type, join.timeout_s
        )
        self._root = dist.BroadcastOptions()
        self._root.rootRank = 0

    def broadcast(self, tensor: Tensor) -> None:
        self._pg.broadcast([tensor], self._root).wait()

    def barrier(self) -> None:
        if self.join.device_type == "cuda":  # NCCL's barrier needs the device it runs on
            opts = dist.BarrierOptions()
            opts.device_ids = [self.device.index]
            self._pg.barrier(opts).wait()
        else:
            self._pg.barrier().wait()

    def header(self, status: int = 0, index: int = 0) -> tuple[int, int]:
        head = torch.tensor([status, index], dtype=torch.int64, device=self.device)
        self.broadcast(head)
        status, index = head.tolist()
        return int(status), int(index)


class _SharedBuffer:
    """The ``ipc`` buffer: a device tensor the receivers open through a handle (see module docstring)."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.nbytes = nbytes
        self.path: str | None = None
        if device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            self.tensor = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self.handle: Any = ("cuda", reduce_tensor(self.tensor))
        else:
            base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
            self.path = os.path.join(base, f"thundersync-ipc-{os.getpid()}-{uuid.uuid4().hex}")
            self.tensor = torch.from_file(self.path, shared=True, size=nbytes, dtype=torch.uint8)
            self.handle = ("file", self.path, nbytes)

    def close(self) -> None:
        if self.path is not None and os.path.exists(self.path):
            os.remove(self.path)  # mappings survive the unlink


def _open_handle(handle: Any) -> Tensor:
    if handle[0] == "cuda":
        rebuild, args = handle[1]
        args = list(args)
        args[6] = torch.cuda.current_device()  # storage_device: the same GPU as this process sees it
        return rebuild(*args)
    _, path, nbytes = handle
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


class WeightSender:
    """The learner's side (rank 0). ``join_info`` goes to the receivers, which construct
    :class:`WeightReceiver` while this side calls :meth:`connect`; then, per publish,
    :meth:`prepare` and :meth:`send` (concurrently with the receivers' ``receive_into``)."""

    def __init__(
        self,
        transport: Transport,
        receivers: int,
        device_type: str,
        timeout_s: float,
        host: str = "127.0.0.1",
    ) -> None:
        if transport not in ("ipc", "nccl"):
            raise ValueError(f"transport must be 'ipc' or 'nccl', got {transport!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        # port 0: the OS picks a free port (no race between choosing and binding)
        self._store = dist.TCPStore(
            host, 0, receivers + 1, is_master=True, timeout=timeout, wait_for_workers=False
        )
        self.join_info = JoinInfo(
            transport,
            host,
            self._store.port,
            receivers + 1,
            device_type,
            timeout_s,
            f"thundersync-{uuid.uuid4().hex}",
        )
        self._member: _Member | None = None
        self._shared: _SharedBuffer | None = None

    def connect(self) -> None:
        """Create this rank's backend; returns once every receiver has joined."""
        self._member = _Member(self.join_info, 0, self._store)

    def prepare(self, weights: Mapping[str, Tensor], bucket_bytes: int) -> PublishInfo:
        """Plan the buckets (and grow the shared buffer for ``ipc``); the result goes to the receivers."""
        member = self._connected()
        buckets = plan_buckets(weights, bucket_bytes)
        if self.join_info.transport == "nccl":
            return PublishInfo(buckets)
        need = max((b.nbytes for b in buckets), default=1)
        if self._shared is None or self._shared.nbytes < need:
            self.close_buffer()
            self._shared = _SharedBuffer(need, member.device)
        return PublishInfo(buckets, self._shared.handle)

    def send(self, weights: Mapping[str, Tensor], info: PublishInfo) -> None:
        """Move every bucket of ``info`` to the receivers, in order (see the protocol)."""
        member = self._connected()
        for index, bucket in enumerate(info.buckets):
            try:
                if self.join_info.transport == "nccl":
                    buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=member.device)
                else:
                    assert self._shared is not None, "prepare() first"
                    buffer = self._shared.tensor
                pack_bucket(weights, bucket, buffer)
                if buffer.is_cuda:  # the receivers read it from other streams and processes
                    torch.cuda.current_stream(buffer.device).synchronize()
            except BaseException:
                member.header(0, index)  # the receivers stop at this bucket too
                raise
            member.header(1, index)
            if self.join_info.transport == "nccl":
                member.broadcast(buffer[: bucket.nbytes])
            else:
                member.barrier()  # every receiver has cloned the bucket out

    def close_buffer(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def close(self) -> None:
        self.close_buffer()
        self._member = None

    def _connected(self) -> _Member:
        if self._member is None:
            raise EngineError("WeightSender.connect() has not run: the receivers have not joined")
        return self._member


class WeightReceiver:
    """A receiver's side (rank >= 1): construct it with the learner's ``join_info`` (blocks until
    every rank joined), then :meth:`receive_into` once per publish."""

    def __init__(self, join: JoinInfo, rank: int) -> None:
        if not 1 <= rank < join.world_size:
            raise ValueError(f"receiver rank must be in 1..{join.world_size - 1}, got {rank}")
        timeout = datetime.timedelta(seconds=join.timeout_s)
        store = dist.TCPStore(join.host, join.port, join.world_size, is_master=False, timeout=timeout)
        self._member = _Member(join, rank, store)
        self._opened: tuple[Any, Tensor] | None = None  # (handle, buffer) of the last ipc publish

    def receive_into(self, info: PublishInfo, consume: Callable[[Iterator[tuple[str, Tensor]]], Any]) -> Any:
        """Run ``consume`` over the publish's (name, tensor) pairs, in order; returns its result.

        If ``consume`` raises, the remaining buckets are received and dropped (the sender stays in
        lockstep), then the error propagates. A learner's abort raises :class:`TransferAborted`.
        """
        state = {"next": 0, "aborted": False}
        try:
            pairs = self._pairs(info, state)
            result = consume(pairs)
            left = sum(1 for _ in pairs)  # a consumer that stops early must not stall the sender
            if left:
                raise EngineError(
                    f"the receiver's loader stopped {left} tensors before the end of the publish"
                )
            return result
        except BaseException:
            if not state["aborted"]:
                for index in range(state["next"], len(info.buckets)):
                    if self._bucket(info, index, keep=False) is None:
                        break
            raise

    def _pairs(self, info: PublishInfo, state: dict[str, Any]) -> Iterator[tuple[str, Tensor]]:
        while state["next"] < len(info.buckets):
            index = state["next"]
            state["next"] += 1
            pairs = self._bucket(info, index, keep=True)
            if pairs is None:
                state["aborted"] = True
                raise TransferAborted(
                    f"the learner aborted the publish at bucket {index} of {len(info.buckets)}; "
                    "earlier buckets were loaded"
                )
            yield from pairs

    def _bucket(self, info: PublishInfo, index: int, keep: bool) -> list[tuple[str, Tensor]] | None:
        """Take part in bucket ``index``; its pairs (None when the learner aborted)."""
        member, bucket = self._member, info.buckets[index]
        status, sent = member.header()
        if status == 0:
            return None
        if sent != index:
            raise EngineError(f"weight transfer out of order: bucket {sent} arrived, {index} expected")
        if member.join.transport == "nccl":
            buffer = torch.empty(bucket.nbytes, dtype=torch.uint8, device=member.device)
            member.broadcast(buffer)
            return unpack_bucket(buffer, bucket) if keep else []
        # ipc: clone out (vLLM's loader may keep a layer's tensors until the layer is complete),
        # then release the shared buffer to the learner
        pairs = [(n, t.clone()) for n, t in unpack_bucket(self._shared(info.handle), bucket)] if keep else []
        if member.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        member.barrier()
        return pairs

    def _shared(self, handle: Any) -> Tensor:
        if self._opened is None or self._opened[0] != handle:
            self._opened = (handle, _open_handle(handle))
        return self._opened[1]
