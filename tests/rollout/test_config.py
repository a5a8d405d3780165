"""Engine configs: validation reports every problem; YAML construction through jsonargparse."""

from __future__ import annotations

import pytest
from jsonargparse import ArgumentParser

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.rollout import EmbeddedEngineConfig, TraceReplayEngineConfig


def test_an_invalid_embedded_config_lists_every_problem_at_once():
    with pytest.raises(ConfigError) as err:
        EmbeddedEngineConfig(
            temperature=0.0, top_p=1.5, env_workers=0, verdict_timeout_s=-1, start_method="fork"
        )
    message = str(err.value)
    for name in ("temperature", "top_p", "env_workers", "verdict_timeout_s", "start_method='fork'"):
        assert name in message


def test_the_engine_forks_from_the_fork_server_by_default_and_takes_spawn_from_yaml():
    assert EmbeddedEngineConfig().start_method == "forkserver"
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--engine", type=EmbeddedEngineConfig)
    init = parser.instantiate_classes(parser.parse_string("engine: {start_method: spawn}\n"))
    assert init.engine == EmbeddedEngineConfig(start_method="spawn")


def test_an_invalid_replay_config_lists_every_problem_at_once():
    with pytest.raises(ConfigError) as err:
        TraceReplayEngineConfig(time_scale_s=0, reward_p=2, turns=0)
    assert all(name in str(err.value) for name in ("time_scale_s", "reward_p", "turns"))


def test_configs_and_the_toy_task_are_constructible_from_yaml():
    parser = ArgumentParser()
    parser.add_argument("--engine", type=EmbeddedEngineConfig)
    parser.add_argument("--replay", type=TraceReplayEngineConfig)
    parser.add_argument("--tasks", type=GuessingGameTasks)
    cfg = parser.parse_string(
        "engine: {temperature: 0.8, env_workers: 4}\n"
        "replay: {source: pareto, time_scale_s: 0.02}\n"
        "tasks: {num_digits: 6, latency_median_s: 0.01}\n"
    )
    init = parser.instantiate_classes(cfg)
    assert init.engine == EmbeddedEngineConfig(temperature=0.8, env_workers=4)
    assert init.replay == TraceReplayEngineConfig(source="pareto", time_scale_s=0.02)
    assert init.tasks == GuessingGameTasks(num_digits=6, latency_median_s=0.01)


def test_yaml_with_a_misspelt_engine_option_fails_naming_it():
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--engine", type=EmbeddedEngineConfig)
    with pytest.raises(Exception, match="verdict_timout_s"):
        parser.instantiate_classes(parser.parse_string("engine: {verdict_timout_s: 5}\n"))


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: TraceReplayEngineConfig(gen_median=2.0), "gen_median=2.0 has no effect with source='trace'"),
        (lambda: TraceReplayEngineConfig(source="lognormal", trace="x.json"), "trace='x.json' has no effect"),
        (
            lambda: TraceReplayEngineConfig(source="lognormal", pareto_alpha=3.0),
            "pareto_alpha=3.0 has no effect",
        ),
        (
            lambda: TraceReplayEngineConfig(source="pareto", verdict_sigma=2.0),
            "verdict_sigma=2.0 has no effect",
        ),
    ],
)
def test_a_replay_option_that_the_chosen_source_ignores_is_rejected(build, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(".", r"\.")):
        build()


def test_the_embedded_engine_restart_budget_must_not_be_negative():
    with pytest.raises(ConfigError, match="max_engine_restarts=-1"):
        EmbeddedEngineConfig(max_engine_restarts=-1)
    assert EmbeddedEngineConfig().max_engine_restarts == 1


def test_the_wait_for_the_next_event_is_bounded_by_default_from_the_environment_limits():
    config = EmbeddedEngineConfig(step_timeout_s=60.0, verdict_timeout_s=300.0, startup_timeout_s=120.0)
    assert config.idle_timeout_s == "auto"
    # startup + 2 * (max_turns * step + verdict): 120 + 2 * (4 * 60 + 300)
    assert config.idle_limit_s(max_turns=4) == 1200.0
    assert EmbeddedEngineConfig(idle_timeout_s=5.0).idle_limit_s(max_turns=4) == 5.0
    assert EmbeddedEngineConfig(idle_timeout_s=None).idle_limit_s(max_turns=4) is None
    with pytest.raises(ConfigError, match="idle_timeout_s='soon': must be > 0 seconds, 'auto' or None"):
        EmbeddedEngineConfig(idle_timeout_s="soon")  # type: ignore[arg-type]
    parser = ArgumentParser()
    parser.add_argument("--engine", type=EmbeddedEngineConfig)
    for value, expected in (("auto", "auto"), ("30", 30.0), ("null", None)):
        assert parser.parse_args([f"--engine.idle_timeout_s={value}"]).engine.idle_timeout_s == expected


@pytest.mark.parametrize("kind", ["VLLMEngineConfig", "VLLMServerEngineConfig"])
def test_the_vllm_engines_wait_is_derived_from_the_environment_limits_too(kind, caplog):
    """``event_timeout_s: auto`` bounds the wait by what bounds every event, so a step of long
    episodes (SWE-bench: 16 turns of 300 s, a 2400 s verdict) is never cut off by a fixed 600 s."""
    import thundersync_lightning.rollout as rollout

    cls = getattr(rollout, kind)
    extra = {"urls": ["http://127.0.0.1:8000"]} if kind == "VLLMServerEngineConfig" else {}
    swe = cls(step_timeout_s=300.0, verdict_timeout_s=2400.0, **extra)
    assert swe.event_timeout_s == "auto"
    assert swe.event_limit_s(max_turns=16) == 600 + 2 * (16 * 300 + 2400)  # 15000 s
    assert swe.transfer_timeout_s == 600  # a publish's buckets do not wait on episodes
    assert (
        cls(step_timeout_s=None, **extra).event_limit_s(max_turns=4) is None
    )  # unbounded calls: unbounded wait
    explicit = cls(event_timeout_s=900.0, step_timeout_s=300.0, verdict_timeout_s=2400.0, **extra)
    with caplog.at_level("WARNING"):
        assert explicit.event_limit_s(max_turns=16) == 900.0 and explicit.transfer_timeout_s == 900.0
    assert f"{kind}.event_timeout_s=900 s is shorter than one episode may take" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert cls(event_timeout_s=7200.0, **extra).event_limit_s(max_turns=4) == 7200.0
    assert not caplog.text
    for bad in (0, -1.0, "soon", True):
        with pytest.raises(ConfigError, match="event_timeout_s must be > 0 seconds or 'auto'"):
            cls(event_timeout_s=bad, **extra)
    parser = ArgumentParser()
    parser.add_argument("--engine", type=cls)
    base = [f"--engine.urls={extra['urls']}"] if extra else []
    for value, expected in (("auto", "auto"), ("30", 30.0)):
        assert (
            parser.parse_args([*base, f"--engine.event_timeout_s={value}"]).engine.event_timeout_s == expected
        )
