"""FSDP2: weights, gradients and optimizer state sharded over ranks (``sharding="fsdp2"``).

torch's ``fully_shard`` splits every trainable child of the LightningModule (and each block of its
outermost ``nn.ModuleList``s, e.g. a transformer's layers) along dim 0 over a 1-D device mesh of the
W ranks: between steps a rank holds 1/W of each weight as a ``DTensor`` shard, and the optimizer is
built over those shards (so its state is sharded too).

Weights are frozen during a step, so they are all-gathered *once* per step instead of per forward:
every FSDP unit is unsharded after the optimizer step (``reshard_after_forward=False``,
``set_reshard_after_backward(False)``), and per-trajectory backward passes do not reduce-scatter
(``set_requires_gradient_sync(False)``). While gathered, ``module.parameters()`` are plain full
tensors: they are what the streaming accumulator differentiates, what its ``p._version`` check
watches and what the rollout engine is published from. The accumulator's buffers are therefore over
the *local full* parameters (each rank sums its own trajectories; a per-trajectory reduce-scatter
would need every rank to take part in every other rank's trajectory).

At the barrier the folded full gradient g_r of each rank is reduce-scattered in one collective:
rank r receives rows [r c, (r+1) c) (c = ceil(n_0 / W), ``torch.chunk`` layout, as FSDP2 shards) of
sum_r g_r, written as the shard's ``DTensor`` ``.grad``; clipping and the optimizer act on shards.
After the step the units are resharded and gathered again (weights theta_{v+1}).

Memory per rank: the full weights while gathered (the whole step, as without sharding) plus the
1/W shard; 1/W of the gradient and of the optimizer state; the accumulator's buffers full-size.
What FSDP2 saves here is optimizer state and gradient (and between-step weights, if a later
change reshards between steps); activations and accumulator buffers are unchanged.

Checkpoints hold full (unsharded) state dicts, gathered with
``torch.distributed.checkpoint.state_dict`` (``full_state_dict=True``) and written by rank 0: the
weights load anywhere; the optimizer state is keyed by parameter name (that API's format), so it
resumes ``fsdp2`` runs, not ``none``/``zero1`` ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Shard

from ...core.errors import ConfigError, PolicyChangedError
from .base import Layout, Sharding, trainable

__all__ = ["FSDP2", "shard_units"]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def shard_units(module: nn.Module) -> list[nn.Module]:
    """What ``fully_shard`` wraps, children before parents: each block of the outermost
    ``nn.ModuleList``s of every child that has trainable parameters, then that child.
    Children without trainable parameters (a frozen reference model) stay replicated."""
    units: list[nn.Module] = []
    for child in module.children():
        if not any(p.requires_grad for p in child.parameters()):
            continue
        inner: set[int] = set()
        for sub in child.modules():
            if isinstance(sub, nn.ModuleList) and id(sub) not in inner:
                units += list(sub)
                inner.update(id(m) for block in sub for m in block.modules())
        units.append(child)
    return units


class FSDP2(Layout):
    """Sharded weights, gathered once per step; one reduce-scatter of the folded gradient per step."""

    name: Sharding = "fsdp2"

    def __init__(self, distributed: bool) -> None:
        super().__init__(distributed)
        self._units: list[FSDPModule] = []
        self._shards: dict[
            str, DTensor
        ] = {}  # trainable parameter name -> its shard (what the optimizer steps)
        self._gathered: dict[str, Tensor] = {}
        self._shard_versions: dict[str, int] = {}

    @classmethod
    def problems(cls, processes: int) -> list[str]:
        if processes >= 2:
            return []
        return [
            "sharding='fsdp2' shards the weights over processes and there is one; use devices >= 2 (or "
            "num_nodes >= 2), or sharding='none' in one process"
        ]

    # ------------------------------------------------------------------ set-up
    def shard(self, module: nn.Module, device: torch.device) -> None:
        if not self.distributed:
            raise ConfigError(
                "sharding='fsdp2' needs a process group: run with devices >= 2 (or num_nodes >= 2)"
            )
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        units = shard_units(module)
        for unit in units:
            fully_shard(unit, mesh=mesh, reshard_after_forward=False)
        self._units = [u for u in units if isinstance(u, FSDPModule)]
        for unit in self._units:
            unit.set_requires_gradient_sync(False)  # per-trajectory backward passes stay local
            unit.set_reshard_after_backward(False)
        self._shards = {}
        loose = []
        for name, p in trainable(module):
            if isinstance(p, DTensor) and tuple(p.placements) == (Shard(0),):
                self._shards[name] = p
            else:
                loose.append(name)
        if loose:
            raise ConfigError(
                f"sharding='fsdp2' shards the LightningModule's children, but {loose[:5]} are trainable "
                "parameters outside them (or not sharded on dim 0); register them inside a child module"
            )

    # ------------------------------------------------------------------ the step
    def gather(self, module: nn.Module) -> None:
        """Full weights registered, and the shards' version counters recorded: these are theta_v."""
        self._unshard(module)
        self._shard_versions = {n: s.to_local()._version for n, s in self._shards.items()}

    def _unshard(self, module: nn.Module) -> None:
        """Full weights registered again (after a state dict resharded them); the weights are unchanged."""
        for unit in self._units:
            unit.unshard()
        self._gathered = dict(trainable(module))
        if any(isinstance(p, DTensor) for p in self._gathered.values()):
            raise RuntimeError(
                "FSDP2 unshard left sharded parameters registered; the step needs full weights"
            )

    def check_frozen(self, module: nn.Module) -> None:
        """The gathered tensors are still the registered ones and no shard was written since ``gather``
        (an all-gather writes without bumping the full tensors' version counters)."""
        current = dict(trainable(module))
        moved = [n for n, p in self._gathered.items() if current.get(n) is not p]
        moved += [n for n, s in self._shards.items() if s.to_local()._version != self._shard_versions.get(n)]
        if moved:
            raise PolicyChangedError(
                f"sharding='fsdp2': {len(moved)} parameter(s) ({moved[:5]}) were resharded or updated during "
                "the step; the gathered weights the trajectories were differentiated at are no longer the "
                "policy's. Do not call reshard(), state_dict() or the optimizer between "
                "the first event and the barrier."
            )

    def reduce_gradients(self, module: nn.Module) -> None:
        """One reduce-scatter: rank r's segment is [chunk r of every parameter], each padded to c rows."""
        world = dist.get_world_size()
        names = list(self._shards)
        full = [self._gathered[n] for n in names]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in full]
        rows = [-(-g.shape[0] // world) for g in grads]  # c = ceil(n_0 / W)
        pieces = []
        for r in range(world):
            for g, c in zip(grads, rows):
                chunk = g[r * c : (r + 1) * c].reshape(-1)
                pad = c * (g.numel() // max(g.shape[0], 1)) - chunk.numel()
                pieces += [chunk, g.new_zeros(pad)] if pad else [chunk]
        send = torch.cat(pieces)
        recv = send.new_empty(send.numel() // world)
        dist.reduce_scatter_tensor(recv, send)  # SUM over ranks
        sizes = [c * (g.numel() // max(g.shape[0], 1)) for g, c in zip(grads, rows)]
        for name, p, piece in zip(names, full, recv.split(sizes)):
            shard = self._shards[name]
            local_shape = shard.to_local().shape
            local = piece[: local_shape.numel()].view(local_shape).clone()
            shard.grad = DTensor.from_local(
                local,
                shard.device_mesh,
                shard.placements,
                run_check=False,
                shape=shard.shape,
                stride=shard.stride(),
            )
            p.grad = None  # the full gradient is spent: free it before the optimizer step

    def after_optimizer_step(self, module: nn.Module) -> None:
        self._reshard()
        self.gather(module)

    def _reshard(self) -> None:
        for unit in self._units:
            unit.reshard()

    def weights_fn(self, module: Any) -> Callable[[], Mapping[str, Tensor]]:
        """Full weights for the engine (an all-gather per tensor on every rank; state_dict reshards)."""

        def weights() -> dict[str, Tensor]:
            named = module.weights_for_engine()
            full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in named.items()}
            self._unshard(module)
            return full

        return weights

    # ------------------------------------------------------------------ checkpoints (full state dicts)
    def module_state_dict(self, module: nn.Module, default: Callable[[], dict]) -> dict:
        if not self._units:
            return default()
        self._reshard()
        state = get_model_state_dict(module, options=_FULL)
        self._unshard(module)
        return state

    def load_module_state_dict(
        self, module: nn.Module, state: Mapping[str, Any], default: Callable[[], None]
    ) -> None:
        if not self._units:
            return default()  # before set-up: a plain module loads the full state as it is
        self._reshard()
        set_model_state_dict(module, dict(state), options=StateDictOptions(full_state_dict=True))
        self.gather(module)  # the loaded weights are the current ones now

    def optimizer_state(self, module: nn.Module, optimizer: Any, default: Callable[[], dict]) -> dict:
        self._reshard()  # state dict keys map the optimizer's shards to names through the registered params
        state = get_optimizer_state_dict(module, _inner(optimizer), options=_FULL)
        self._unshard(module)
        return state

    def load_optimizer_states(
        self,
        module: nn.Module,
        optimizers: Sequence[Any],
        states: Sequence[Mapping[str, Any]],
        default: Callable[[], None],
    ) -> None:
        self._reshard()
        for optimizer, state in zip(optimizers, states):
            set_optimizer_state_dict(
                module, _inner(optimizer), dict(state), options=StateDictOptions(full_state_dict=True)
            )
        self._unshard(module)


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer wraps the torch one
