"""The multi-node launch path on one machine: 2 processes, each told by env vars it is one node of 2.

On a cluster every node starts its own processes (``srun``, ``torchrun``) and Lightning only reads
who it is from the environment; here the test plays the scheduler: it starts both "nodes" on
this machine with the variables SLURM, torchrun or a manual launch set, on gloo. Both ranks must
end with the parameters of a single-process run of the same batch (each trained half the groups).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ._fit import relative

SCRIPT = Path(__file__).with_name("multinode_script.py")
_LAUNCH_VARS = (
    "SLURM_",
    "TORCHELASTIC_",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "JSM_",
    "OMPI_",
    "PMI_",
    "KUBERNETES_",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_env(kind: str, node: int, nodes: int, port: int) -> dict[str, str]:
    """What the scheduler sets for the one process of node ``node`` (one device per node)."""
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if kind == "lightning":  # a manual launch: LightningEnvironment (LOCAL_RANK set: launched externally)
        return {**common, "NODE_RANK": str(node), "LOCAL_RANK": "0", "WORLD_SIZE": str(nodes)}
    if kind == "slurm":  # srun --nodes=2 --ntasks-per-node=1: SLURMEnvironment
        return {
            **common,
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "thundersync",
            "SLURM_NTASKS": str(nodes),
            "SLURM_NTASKS_PER_NODE": "1",
            "SLURM_NNODES": str(nodes),
            "SLURM_NODEID": str(node),
            "SLURM_PROCID": str(node),
            "SLURM_LOCALID": "0",
            "SLURM_NODELIST": "127.0.0.1",
        }
    assert kind == "torchelastic"  # torchrun --nnodes=2 --nproc-per-node=1: TorchElasticEnvironment
    return {
        **common,
        "TORCHELASTIC_RUN_ID": "thundersync",
        "RANK": str(node),
        "GROUP_RANK": str(node),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "WORLD_SIZE": str(nodes),
        "GROUP_WORLD_SIZE": str(nodes),
    }


def _launch(tmp_path: Path, kind: str | None, nodes: int) -> list[dict]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCH_VARS)}
    base.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    out, port = tmp_path / f"{kind}", _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(out), str(nodes)],
            cwd=tmp_path,
            env={**base, **(_node_env(kind, node, nodes, port) if kind else {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(nodes)
    ]
    for p in procs:
        log, _ = p.communicate(timeout=300)
        assert p.returncode == 0, log[-4000:]
    return [torch.load(f"{out}-{rank}.pt") for rank in range(nodes)]


ENVIRONMENTS = {
    "lightning": "LightningEnvironment",
    "slurm": "SLURMEnvironment",
    "torchelastic": "TorchElasticEnvironment",
}


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict:
    (one,) = _launch(tmp_path_factory.mktemp("single"), None, 1)
    return one


# Lightning's own variables stay in make test; SLURM's and torchrun's are make test-slow (~12 s each)
@pytest.mark.parametrize(
    "kind",
    [
        "lightning",
        pytest.param("slurm", marks=pytest.mark.slow),
        pytest.param("torchelastic", marks=pytest.mark.slow),
    ],
)
def test_two_nodes_launched_by_environment_variables_train_the_parameters_of_one_process(
    tmp_path, single, kind
):
    ranks = _launch(tmp_path, kind, 2)
    assert [r["environment"] for r in ranks] == [ENVIRONMENTS[kind]] * 2
    assert [r["rank"] for r in ranks] == [(0, 0, 0), (1, 1, 0)]  # (global, node, local)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["groups_global"] for r in ranks] == [[4, 4], [4, 4]] == [single["groups_global"]] * 2
    assert [r["trajectories"] for r in ranks] == [[8, 8], [8, 8]]  # each node its own half of the groups
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])  # one optimizer step on the same gradient
    assert relative(ranks[0]["params"], single["params"]) <= 1e-5
