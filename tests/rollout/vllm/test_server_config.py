"""The server engine's pieces that need no vLLM: its config, the JSON wire form of a publish, and an
unreachable server refused at set-up (tests/rollout/vllm/test_server_engine.py runs real servers)."""

from __future__ import annotations

import socket

import pytest
import torch

from thundersync_lightning.core.errors import ConfigError, EngineError
from thundersync_lightning.core.types import ModelSpec
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.rollout import VLLMServerEngineConfig
from thundersync_lightning.rollout.weights.transport import (
    JoinInfo,
    PublishInfo,
    join_from_json,
    join_to_json,
    plan_buckets,
    publish_from_json,
    publish_to_json,
)


def test_a_config_reports_every_problem_at_once():
    with pytest.raises(ConfigError) as err:
        VLLMServerEngineConfig(
            urls=["localhost:8000", "http://a:1", "http://a:1", "http://b", "http://c:2/v1"],
            temperature=0.0,
            max_inflight_per_server=0,
            request_timeout_s=0,
            restart_wait_s=-1,
        )
    message = str(err.value)
    for part in (
        "'localhost:8000': expected http://HOST:PORT",
        "urls repeat ['http://a:1']",
        "'http://b': name the port",
        "'http://c:2/v1': give the server's root",
        "temperature must be > 0",
        "max_inflight_per_server must be >= 1",
        "request_timeout_s must be > 0",
        "restart_wait_s must be >= 0 seconds",
    ):
        assert part in message


def test_a_config_needs_at_least_one_server_and_takes_a_yaml_list():
    with pytest.raises(ConfigError, match="at least one vLLM server"):
        VLLMServerEngineConfig(urls=[])
    assert VLLMServerEngineConfig(urls=["http://10.0.0.2:8000"]).urls == ("http://10.0.0.2:8000",)


def test_an_unknown_option_is_refused_by_name():
    with pytest.raises((ConfigError, TypeError), match="weight_sync"):
        VLLMServerEngineConfig(urls=["http://a:1"], weight_sync="file")  # type: ignore[call-arg]


def test_a_publish_layout_survives_its_json_wire_form():
    weights = {
        "a": torch.zeros(3, 5),
        "b": torch.zeros(7, dtype=torch.bfloat16),
        "c": torch.zeros(2, 2, 2, dtype=torch.int64),
    }
    info = PublishInfo(plan_buckets(weights, bucket_bytes=64))
    assert len(info.buckets) > 1
    assert publish_from_json(publish_to_json(info)) == info
    join = JoinInfo("nccl", "10.0.0.1", 1234, 3, "cpu", 60.0, "thundersync-x")
    assert join_from_json(join_to_json(join)) == join


@pytest.mark.parametrize(
    "text",
    ['[{"nbytes": 4, "slots": [["a", "os.system", [1], 0, 4]]}]', '[{"slots": []}]', "not json"],
)
def test_a_malformed_publish_message_is_refused(text):
    with pytest.raises(EngineError, match="malformed weight-transfer publish message"):
        publish_from_json(text)


def test_a_join_over_the_network_takes_only_the_broadcast_transport():
    ipc = JoinInfo("ipc", "10.0.0.1", 1234, 3, "cpu", 60.0, "g")
    with pytest.raises(EngineError, match="takes transport 'nccl'"):
        join_from_json(join_to_json(ipc))


def test_an_unreachable_server_is_a_set_up_error_naming_its_url():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    config = VLLMServerEngineConfig(urls=[url], connect_timeout_s=5.0)
    spec = ModelSpec(model_type="qwen3", config={"vocab_size": 16})
    with pytest.raises(EngineError, match=f"cannot reach the vLLM server at {url}"):
        config.build(spec, GuessingGameTasks(latency="none"))


def test_the_shipped_servers_config_builds_a_valid_engine_config_that_alone_sets_the_temperature():
    from pathlib import Path

    import yaml

    config = yaml.safe_load(
        (Path(__file__).resolve().parents[3] / "configs" / "gpu_vllm_servers.yaml").read_text()
    )
    engine = config["data"]["engine"]
    assert engine["class_path"] == "thundersync_lightning.rollout.VLLMServerEngineConfig"
    built = VLLMServerEngineConfig(**engine["init_args"])
    # the sampling temperature's one home is the engine; the module reads it at set-up
    assert "temperature" not in config["model"] and built.temperature == 1.0 and built.max_model_len == 2048


def _rank_split(rank: int, port: int, out: str) -> None:
    import json

    import torch.distributed as dist

    from thundersync_lightning.rollout.vllm.server_engine import _rank_urls

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        urls = [f"http://infer-{k}:8000" for k in range(5)]
        try:
            _rank_urls(urls[:1])
            refused = ""
        except EngineError as exc:
            refused = str(exc)
        with open(f"{out}/{rank}.json", "w") as f:
            json.dump({"mine": _rank_urls(urls), "refused": refused}, f)
    finally:
        dist.destroy_process_group()


def test_two_learner_ranks_split_the_servers_so_each_server_has_one_publisher(tmp_path):
    """Rank r of N takes ``urls[r::N]`` (two real gloo ranks): disjoint, covering, and fewer servers
    than ranks refused on every rank."""
    import json

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_split, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert got[0]["mine"] == ["http://infer-0:8000", "http://infer-2:8000", "http://infer-4:8000"]
    assert got[1]["mine"] == ["http://infer-1:8000", "http://infer-3:8000"]
    assert all("2 learner ranks share 1 vLLM servers" in g["refused"] for g in got)


@pytest.mark.parametrize("versions", [None, [{"version": "0", "start": 0}]])
def test_a_server_whose_responses_name_no_weight_version_is_a_set_up_error(monkeypatch, versions):
    """Every response of such a server would be refused as stale at the first rollout: set-up says why."""
    from thundersync_lightning.rollout.vllm import server_client
    from thundersync_lightning.rollout.vllm.server_client import ServerClient

    flags = server_client._CHECKED_FLAGS
    answers = {
        "/health": {},
        "/server_info?config_format=json": {
            "vllm_config": {
                "model_config": {
                    "logprobs_mode": flags["--logprobs-mode"],
                    "generation_config": flags["--generation-config"],
                    "max_model_len": 64,
                    "dtype": "torch.float32",
                },
                "parallel_config": {"worker_extension_cls": flags["--worker-extension-cls"]},
            }
        },
        "/get_world_size?include_dp=false": {"world_size": 1},
        "/inference/v1/generate": {
            "choices": [
                {
                    "token_ids": [5],
                    "logprobs": {"content": [{"token_id": 5, "logprob": -0.5}]},
                    **({"weight_versions": versions} if versions else {}),
                }
            ]
        },
    }
    monkeypatch.setattr(
        ServerClient, "call", lambda self, method, route, body=None, timeout_s=None: answers[route]
    )
    client = ServerClient("http://127.0.0.1:9", 5.0, 5.0)
    if versions is None:
        with pytest.raises(EngineError, match="names no weight version in its responses"):
            client.info()
    else:
        assert client.info().workers == 1
