"""CLI errors in a few lines: the command is run as a user runs it and its output read back; the
parser's reports are shortened by cli_errors (unit tests on the real parser's messages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jsonargparse import ArgumentError

from tests.callbacks.helpers import subprocess_env
from thundersync_lightning.cli import build_parser, main
from thundersync_lightning.cli_errors import short_parse_error

ROOT = Path(__file__).resolve().parents[1]
TOY = str(ROOT / "configs" / "toy.yaml")


def parse_error(*extra: str) -> str:
    """jsonargparse's own report for the toy config plus ``extra``."""
    parser = build_parser()
    parser.exit_on_error = False
    with pytest.raises(ArgumentError) as err:
        parser.parse_args(["--config", TOY, *extra])
    return str(err.value)


def keys() -> list[str]:
    return [o[2:] for a in build_parser()._actions for o in a.option_strings if o.startswith("--")]


@pytest.mark.parametrize(
    "arg, problem",
    [
        (
            "--trainer.strategy.init_args.max_open_grups=3",
            "--trainer.strategy.init_args.max_open_grups: ThunderSyncStrategy has no option 'max_open_grups' "
            "(did you mean 'max_open_groups'?)",
        ),
        (
            "--trainer.strategy.init_args.mode=streeming",
            "--trainer.strategy.init_args.mode: 'streeming' is not one of streaming, sync, async "
            "(did you mean 'streaming'?)",
        ),
        ("--trainer.max_stpes=5", "unknown option --trainer.max_stpes (did you mean --trainer.max_steps?)"),
        (
            "--data.tasks.init_args.num_digitz=3",
            "--data.tasks.init_args.num_digitz: GuessingGameTasks has no option 'num_digitz' "
            "(did you mean 'num_digits'?)",
        ),
        ("--model.lr=abc", "--model.lr: expected float, got 'abc'"),
        (
            "--data.num_generations=8",
            "unknown option --data.num_generations (TRL's GRPOConfig name; here: data.group_size, "
            "trajectories per prompt)",
        ),
        (
            "--data.tasks.init_args.max_tool_calling_iterations=3",
            "--data.tasks.init_args.max_tool_calling_iterations: GuessingGameTasks has no option "
            "'max_tool_calling_iterations' (TRL's GRPOConfig name; here: data.tasks "
            "(DatasetTasks).max_turns, which is max_tool_calling_iterations + 1)",
        ),
    ],
)
def test_a_parser_report_becomes_the_problem_in_one_line(arg, problem):
    assert short_parse_error(parse_error(arg), keys())[0] == problem


def test_a_trl_name_under_a_yaml_section_is_answered_with_its_counterpart_and_the_sections_options(tmp_path):
    (tmp_path / "trl.yaml").write_text("data:\n  num_generations: 8\n")
    problem, details = short_parse_error(parse_error("--config", str(tmp_path / "trl.yaml")), keys())
    assert problem == (
        "data.num_generations: data has no option 'num_generations' (TRL's GRPOConfig name; here: "
        "data.group_size, trajectories per prompt)"
    )
    assert "group_size" in details[0].split(", ")


def test_an_option_a_class_does_not_take_lists_the_options_it_does_take():
    _, details = short_parse_error(parse_error("--trainer.strategy.init_args.max_open_grups=3"))
    assert details[0].startswith("valid options: mode, offload, max_open_groups, max_held_trajectories")


def test_a_report_it_does_not_know_keeps_its_own_lines_without_the_union_noise():
    problem, details = short_parse_error(
        'Parser key "x":\n  Does not validate against any of the Union subtypes\n  Subtypes: [a]\n'
        "  Errors:\n    - something specific\n  Given value: 3"
    )
    assert (problem, details) == ('Parser key "x":', ["- something specific"])


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(HF_HUB_OFFLINE="1", WANDB_MODE="offline", WANDB_SILENT="true")
    return subprocess.run(
        [sys.executable, "-m", "thundersync_lightning.cli", "fit", "--config", TOY,
         f"--trainer.default_root_dir={tmp_path / 'run'}", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_mistyped_strategy_option_prints_three_lines_with_the_fix_and_exits_2(tmp_path):
    proc = run_cli(tmp_path, "--trainer.strategy.init_args.max_open_grups=3")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, proc.stderr
    assert lines[0].startswith("thundersync-lightning fit: --trainer.strategy.init_args.max_open_grups: ")
    assert "(did you mean 'max_open_groups'?)" in lines[0] and "usage:" not in proc.stderr


@pytest.mark.slow
def test_a_missing_pretrained_path_is_one_message_without_a_traceback(tmp_path):
    proc = run_cli(tmp_path, "--model.pretrained_path=models/none")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "thundersync-lightning fit: GRPOPolicy: pretrained_path 'models/none (from " in proc.stderr
    assert "does not exist" in proc.stderr


@pytest.mark.slow
def test_the_dataset_recipe_with_the_toy_vocabulary_is_refused_at_set_up_naming_both_sizes(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(8))
    )
    tasks = json.dumps({"class_path": "thundersync_lightning.envs.datasets.DatasetTasks",
                        "init_args": {"path": str(data), "fields": {"answer": "answer"}}})  # fmt: skip
    proc = run_cli(tmp_path, f"--data.tasks={tasks}", "--trainer.max_steps=1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "IndexError" not in proc.stderr
    assert "embeds 16 token ids" in proc.stderr and "vocab_size 259" in proc.stderr
    assert not (tmp_path / "run" / "wandb").exists()  # refused before the logger or the engine started


@pytest.mark.slow
def test_an_old_configs_policy_temperature_that_differs_from_the_engines_is_refused_naming_both(tmp_path):
    proc = run_cli(tmp_path, "--model.temperature=1.5", "--trainer.max_steps=1")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "GRPOPolicy(temperature=1.5) (model.temperature in a config)" in proc.stderr
    assert "EmbeddedEngineConfig(temperature=1.0) differ" in proc.stderr


@pytest.mark.slow
def test_a_fit_of_zero_steps_is_refused_instead_of_writing_an_empty_run(tmp_path):
    proc = run_cli(tmp_path, "--trainer.max_steps=0")
    assert proc.returncode == 2 and "max_steps=0: this fit would run no step" in proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_reward_function_that_always_raises_is_warned_counted_in_the_summary_and_fails_the_run(tmp_path):
    tmp_path.chmod(0o755)  # the reward's worker runs as a uid of its own: it reads the module as others do
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(8))
    )
    (tmp_path / "my_rewards.py").write_text(
        "def score(prompt, completion, answer, **row):\n    return 1 / 0  # a bug in the user's reward\n"
    )
    tasks = json.dumps({"class_path": "thundersync_lightning.envs.datasets.DatasetTasks",
                        "init_args": {"path": str(data), "fields": {"answer": "answer"},
                                      "max_action_tokens": 8,
                                      "reward": {"function": "my_rewards:score"}}})  # fmt: skip
    env = subprocess_env(HF_HUB_OFFLINE="1", WANDB_MODE="offline", WANDB_SILENT="true")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "thundersync_lightning.cli", "fit", "--config", TOY,
         f"--trainer.default_root_dir={tmp_path / 'run'}", f"--data.tasks={tasks}",
         "--model.config.vocab_size=259", "--data.groups_per_step=2", "--data.group_size=2",
         "--trainer.max_steps=2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]  # trained on reward 0 alone: a failed run, said so
    assert "the run failed: every reward of the run's 8 trajectories failed" in proc.stderr
    assert "Step 0: the reward of 100% of the trajectories could not be computed" in proc.stderr
    assert "ZeroDivisionError: division by zero" in proc.stderr
    assert "reward errors          100.0% of trajectories" in proc.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["reward_error_fraction"] == 1.0


def test_the_top_level_help_lists_verify_plan_and_export_beside_lightnings_commands(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    for command in ("fit", "validate", "verify", "plan", "export"):
        assert f"\n    {command} " in listed, listed


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["exprot"], "thundersync-lightning: 'exprot' is not a command (did you mean 'export'?)"),
        (["--confg", TOY, "fit"], "thundersync-lightning: unknown option --confg (did you mean --config?)"),
        (["--print_confg", "fit"], "thundersync-lightning: unknown option --print_confg "
                                   "(did you mean --print_config?)"),
        (["export", "--ckpt_path", "x", "--out", "y", "--adaptor-only"],
         "thundersync-lightning export: unknown option --adaptor-only (did you mean --adapter-only?)"),
    ],
)  # fmt: skip
def test_a_mistyped_command_or_top_level_option_gets_a_did_you_mean_and_exit_2(capsys, argv, problem):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == problem and len(lines) <= 3
