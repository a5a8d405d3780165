"""Run by test_strategy_multinode as one process of a job: the cluster environment comes from the env vars.

Trainer(num_nodes=N, devices=1): Lightning detects SLURMEnvironment, TorchElasticEnvironment or
(LOCAL_RANK set) LightningEnvironment and, as on a real cluster, starts no process itself. Each
rank builds its own engine in the data module's setup (a trace replay engine: it starts at once).
"""

from __future__ import annotations

import sys

import torch

if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    from tests.strategy._fit import fit, toy_data
    from thundersync_lightning.rollout import TraceReplayEngineConfig

    out, num_nodes = sys.argv[1], int(sys.argv[2])
    replay = TraceReplayEngineConfig(time_scale_s=0.001)
    gloo = {"process_group_backend": "gloo"}
    params, steps, trainer = fit(
        "streaming", 2, data=toy_data(engine=replay), num_nodes=num_nodes, strategy_kwargs=gloo
    )
    torch.save(
        {
            "params": params,
            "environment": type(trainer.strategy.cluster_environment).__name__,
            "rank": (trainer.global_rank, trainer.node_rank, trainer.local_rank),
            "world_size": trainer.world_size,
            "groups_global": [s.num_groups_global for s in steps],
            "trajectories": [len(s.trajectories) for s in steps],
        },
        f"{out}-{trainer.global_rank}.pt",
    )
