"""Weights from the learner into vLLM servers on other machines: the ``nccl`` bucket transport of
:mod:`..weights.transport` (NCCL between GPUs, gloo on CPU) with the servers' workers as receivers.

Group: the learner is rank 0 and serves the group's ``TCPStore`` at ``learner_host``; server k's
workers (its tensor x pipeline parallel ranks, ``ServerInfo.workers``) join as ranks
``1 + sum of the earlier servers' workers + vLLM rank``, through vLLM's ``/collective_rpc``
calling :meth:`~.worker.WeightSyncExtension.thundersync_join_json` (string arguments: JSON,
never a pickle, crosses the network). A group lasts until a publish fails or the set of live
servers changes; the next publish forms a new one.

One publish, every live server at once:

1. label every server's weights ``partial-<version>`` (vLLM's weight version): from here until
   step 4 anything a server samples carries a label no request expects, so it is refused
   (:class:`~.server_fleet.StaleResponse`);
2. the workers receive (``thundersync_receive_json``, on their own threads of the HTTP calls)
   while this side broadcasts the buckets; a failure on either side fails both (the transport's
   lockstep) and drops the group;
3. reset each server's prefix cache (cached KV blocks hold the old weights' activations);
4. label every server's weights ``<version>``.

Invariant: a server generates under the label ``<version>`` only with every tensor of that
version loaded and its cache reset. A publish that fails half-way leaves the servers labelled
``partial-<version>``: whatever they would sample is refused until a complete publish succeeds
(and the engine refuses to issue requests meanwhile).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TypeVar
from urllib.parse import urlsplit

import torch
from torch import Tensor

from ...core.errors import EngineError
from ..weights.transport import WeightSender, join_to_json, publish_to_json
from .server_client import ServerClient
from .stream import _in_thread  # a daemon thread: a stuck transfer never blocks exit

__all__ = ["FleetPublish", "learner_address"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def learner_address(url: str) -> str:
    """The address of this machine on the route to the server at ``url`` (what its workers dial)."""
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent
        probe.connect((parts.hostname or "127.0.0.1", parts.port or 80))
        return str(probe.getsockname()[0])


class FleetPublish:
    """Bucketed publishes into the workers of a set of servers; see the module docstring.

    Args:
        bucket_bytes: bytes per bucket (one bucket extra on each side during a publish).
        timeout_s: limit for joining and for one publish's transfer.
        learner_host: the address the servers' workers reach this process at.
    """

    def __init__(self, bucket_bytes: int, timeout_s: float, learner_host: str) -> None:
        self._bucket_bytes = bucket_bytes
        self._timeout_s = timeout_s
        self._host = learner_host
        self._sender: WeightSender | None = None
        self._members: tuple[tuple[ServerClient, int], ...] = ()

    def publish(
        self, servers: Sequence[tuple[ServerClient, int]], weights: Mapping[str, Tensor], version: int
    ) -> None:
        """Load ``weights`` into every worker of ``servers``
        ((client, workers) pairs) and label them ``version``."""
        members = tuple(servers)
        try:
            if self._sender is None or members != self._members:
                self.close()
                self._sender = self._join(members)
                self._members = members
            _each(members, lambda c: c.label_weights(f"partial-{version}"), self._timeout_s)
            sender = self._sender
            info = sender.prepare(weights, self._bucket_bytes)
            wire = publish_to_json(info)
            received = [
                _in_thread(lambda c=c: c.collective_rpc("thundersync_receive_json", wire)) for c, _ in members
            ]
            sent: BaseException | None = None
            try:
                sender.send(weights, info)
            except BaseException as exc:  # the workers stop at the same bucket: collect their answers first
                sent = exc
            counts = _results(received, self._timeout_s, members, sent)
            if any(int(n) != len(weights) for n in counts):
                raise EngineError(f"the servers' workers loaded {counts} tensors of {len(weights)}")
            _each(members, lambda c: c.reset_prefix_cache(), self._timeout_s)
            _each(members, lambda c: c.label_weights(str(version)), self._timeout_s)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        self._members = ()

    def _join(self, members: Sequence[tuple[ServerClient, int]]) -> WeightSender:
        sender = WeightSender(
            "nccl",
            receivers=sum(workers for _, workers in members),
            device_type="cuda" if torch.cuda.is_available() else "cpu",
            timeout_s=self._timeout_s,
            host=self._host,
        )
        wire = join_to_json(sender.join_info)
        joined, first = [], 1
        for client, workers in members:
            joined.append(
                _in_thread(lambda c=client, r=first: c.collective_rpc("thundersync_join_json", wire, str(r)))
            )
            first += workers
        connected = _in_thread(sender.connect)
        try:
            _results(joined, self._timeout_s, members, None)  # a server that cannot join fails here first
            connected.result(timeout=self._timeout_s)
        except BaseException:
            sender.close()
            raise
        return sender


def _each(
    members: Sequence[tuple[ServerClient, int]], fn: Callable[[ServerClient], object], timeout_s: float
) -> None:
    _results([_in_thread(lambda c=c: fn(c)) for c, _ in members], timeout_s, members, None)


def _results(
    futures: Sequence[Future[T]],
    timeout_s: float,
    members: Sequence[tuple[ServerClient, int]],
    sent: BaseException | None,
) -> list[T]:
    """Every future's result (one per server, flattened when a result is a list of per-worker values);
    the first failure raised, naming the server, after all have finished; the learner's own ``sent`` first."""
    out: list = []
    failed: list[str] = []
    first: BaseException | None = None
    for future, (client, _) in zip(futures, members):
        try:
            result = future.result(timeout=timeout_s)
        except BaseException as exc:
            failed.append(f"{client.url}: {type(exc).__name__}: {exc}")
            first = first or exc
            continue
        out.extend(result if isinstance(result, list) else [result])
    if sent is not None:
        raise EngineError(f"{type(sent).__name__}: {sent} (the servers' workers stopped there too)") from sent
    if first is not None:
        raise EngineError("weight publish failed on " + "; ".join(failed)) from first
    return out
