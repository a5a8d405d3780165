"""Run by test_sharding as its own process (Lightning's popen launcher re-runs this file per rank).

``python sharding_script.py OUT DEVICES RUN...``; a RUN is ``MODE/SHARDING[/cut][/clip]`` (a 3-step fit;
``cut``: the boundary cut, ``clip``: gradient clipping at norm 0.05, below the toy's gradient norms) or
``resume/SHARDING`` (4 steps with a checkpoint at step 2, then a fresh fit resumed from it) or
``uneven/fsdp2`` (the layout alone on odd shapes, after a fit). All runs
share one process group. Rank r writes ``OUT/<run>.rank<r>.pt``: the full parameters after the fit,
the staleness of every trajectory and the optimizer state this rank holds (tensors and bytes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.distributed.tensor import DTensor

from thundersync_lightning.strategy import ThunderSyncStrategy

torch.set_num_threads(1)


def full_params(module: torch.nn.Module) -> torch.Tensor:
    tensors = [p.full_tensor() if isinstance(p, DTensor) else p for p in module.parameters()]
    return torch.cat([t.detach().reshape(-1).clone() for t in tensors])


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """(tensors, bytes) of optimizer state held by this rank
    (ZeRO's local optimizer, FSDP2's local shards)."""
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer.optim: this rank's partition
    tensors = [
        v.to_local() if isinstance(v, DTensor) else v for s in local.state.values() for v in s.values()
    ]
    tensors = [t for t in tensors if torch.is_tensor(t) and t.dim() > 0]  # the step counters are scalars
    return len(tensors), sum(t.numel() * t.element_size() for t in tensors)


def fit(mode: str, sharding: str, devices: int, steps: int, cut: bool = False, **kwargs):
    from tests.strategy._fit import TOY_MODEL, RecordSteps, toy_data
    from thundersync_lightning.modules import GRPOPolicy

    L.seed_everything(0)
    policy = GRPOPolicy(config=TOY_MODEL, dtype="float64")  # float64: the layouts sum in different orders
    record = RecordSteps()
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode, sharding=sharding, boundary_cut=cut),
        accelerator="cpu",
        devices=devices,
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[record, *kwargs.pop("callbacks", [])],
        enable_checkpointing=kwargs.pop("enable_checkpointing", False),
        **kwargs,
    )
    trainer.fit(policy, toy_data(), ckpt_path=ckpt_path)
    return policy, trainer, record


def uneven_fsdp2() -> dict:
    """The FSDP2 layout alone, on rows that do not divide by the world size (5, 1 and 3 rows over 2
    ranks), on the process group of the fits before: each shard's gradient against the sum of every
    rank's full gradient, and the frozen check."""
    from thundersync_lightning.core.errors import PolicyChangedError
    from thundersync_lightning.strategy.sharding import FSDP2

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))
    module.net.blocks = torch.nn.ModuleList([torch.nn.Linear(1, 3)])
    layout = FSDP2(distributed=True)
    layout.shard(module, torch.device("cpu"))
    shards = dict(module.named_parameters())  # sharded until gathered: what the optimizer steps
    layout.gather(module)
    full = dict(module.named_parameters())
    ramp = {n: torch.arange(p.numel(), dtype=p.dtype).view_as(p) for n, p in full.items()}
    for n, p in full.items():
        p.grad = ramp[n] * (torch.distributed.get_rank() + 1)
    layout.reduce_gradients(module)
    result = {
        "rows": {n: s.to_local().shape[0] for n, s in shards.items()},
        "grads_match": all(torch.equal(shards[n].grad.full_tensor(), ramp[n] * 3) for n in full),  # 1 + 2
        "full_grads_freed": all(p.grad is None for p in full.values()),
    }
    layout.check_frozen(module)  # nothing moved: no error
    module.state_dict()  # FSDP2's state-dict hook reshards: the gathered weights are no longer registered
    try:
        layout.check_frozen(module)
        result["reshard_caught"] = False
    except PolicyChangedError:
        result["reshard_caught"] = True
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    out, devices = Path(sys.argv[1]), int(sys.argv[2])
    for run in sys.argv[3:]:
        mode, sharding, *extra = run.split("/")
        if mode == "uneven":  # after a fit: on its process group
            torch.save(uneven_fsdp2(), out / f"uneven-fsdp2.rank{torch.distributed.get_rank()}.pt")
            continue
        if mode == "resume":
            ckpts = ModelCheckpoint(
                dirpath=out / f"ckpt-{sharding}", every_n_train_steps=2, save_top_k=-1, filename="{step}"
            )
            whole, trainer, _ = fit(
                "streaming", sharding, devices, 4, callbacks=[ckpts], enable_checkpointing=True
            )
            uninterrupted = full_params(whole)
            policy, trainer, record = fit(
                "streaming", sharding, devices, 4, ckpt_path=str(out / f"ckpt-{sharding}" / "step=2.ckpt")
            )
            saved = torch.load(out / f"ckpt-{sharding}" / "step=2.ckpt", weights_only=False)[
                "optimizer_states"
            ][0]
            result = {"uninterrupted": uninterrupted, "steps": [s.step for s in record.steps]}
            result["saved_state_entries"] = len(saved["state"])  # parameters with optimizer state in the file
        else:
            clip = {"gradient_clip_val": 0.05} if "clip" in extra else {}
            policy, trainer, record = fit(mode, sharding, devices, 3, cut="cut" in extra, **clip)
            result = {"staleness": [t.staleness for s in record.steps for t in s.trajectories]}
        tensors, nbytes = optimizer_state(trainer.optimizers[0])
        result |= {"params": full_params(policy), "state_tensors": tensors, "state_bytes": nbytes}
        result["world_size"] = trainer.world_size
        torch.save(result, out / f"{run.replace('/', '-')}.rank{trainer.global_rank}.pt")
