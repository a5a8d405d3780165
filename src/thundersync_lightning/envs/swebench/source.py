"""SWE-bench: instances from a local file, the agent loop in the instance's image, swebench grading.

Instances are rows in swebench's schema (``load_swebench_dataset`` on a local .json/.jsonl/.parquet;
swebench >= 5 rows carry ``image``, ``eval_script``, ``log_parser`` and ``eval_type``). The image's
``/testbed`` is copied to a host directory (on a size- and inode-limited tmpfs where the host
allows it) owned by a pool uid; every agent command runs in a fresh, locked-down container of the
image with that directory bound at /testbed (see :mod:`..sandbox.container`). The image's test
files for the instance are not there during the episode: SWE-bench's ``test_patch`` is applied
only by the eval script, at grading time.

The verdict takes the agent's diff against ``base_commit`` with a host-made bare copy of that
commit as git directory (read-only; the agent's .git config, hooks and filters are never used;
stdout only, see :mod:`.code.patches`), drops file diffs touching test files (those the
instance's ``test_patch`` touches, per git's parse, and any protected path), applies the rest with
``git apply`` only (no fuzzy ``patch`` fallback: it parses paths differently) to a fresh copy of
/testbed, runs the instance's eval script there from a read-only host directory, with the run's
key on stdin only, tagged markers and, for pytest log parsers, the results from the key-signed
reporter (see :mod:`.eval_run`), and grades with ``make_test_spec`` + ``get_eval_report``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ...core.errors import ConfigError
from ...core.options import strict_options
from ..codec import ByteCodec, HFTokenizerCodec, TextCodec
from ..repo.episode import ActionFormat, CodeEnv, Workspace, render_prompt
from ..repo.tools import code_episode_tokens, tool_conversation, tool_renderer
from ..sandbox.base import SandboxLimits
from ..sandbox.container import ContainerConfig
from ..sandbox.hosts import parse_hosts
from ..sandbox.uids import uid_pool
from ..selection import held_out, pick
from .episodes import EpisodeLog, TimedWorkspace
from .workspace import EVAL_TIMEOUT_S, SWEbenchSettings, SWEbenchWorkspace

__all__ = ["SWEbenchTasks", "load_instances"]

log = logging.getLogger(__name__)


def load_instances(path: str, instance_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a local swebench file, checked for the fields grading needs."""
    if not os.path.isfile(path):
        raise ConfigError(f"SWE-bench instance file {path!r} does not exist (a local .json/.jsonl/.parquet)")
    from swebench.harness.utils import load_swebench_dataset

    rows = [dict(r) for r in load_swebench_dataset(path, instance_ids=instance_ids)]
    need = (
        "instance_id",
        "image",
        "eval_script",
        "log_parser",
        "eval_type",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "problem_statement",
        "repo",
        "version",
    )
    problems = [f"{r.get('instance_id', '?')}: missing {k}" for r in rows for k in need if k not in r]
    if problems:
        raise ConfigError("SWE-bench rows lack fields swebench 5 grading needs: " + "; ".join(problems[:10]))
    if not rows:
        raise ConfigError(f"no instances in {path!r}")
    return rows


@strict_options
class SWEbenchTasks:
    """TaskSource over a local SWE-bench file (needs podman or a running docker, and the images).

    Args:
        instances: path of a .json/.jsonl/.parquet file in swebench's schema.
        instance_ids: only these instances.
        engine: "podman", "docker" or "auto". runtime: podman OCI runtime ("auto": runc if present).
        image_override: one local image for every instance (instead of each row's ``image``).
        tokenizer_path: a local HF tokenizer directory; None = the byte-level codec.
        action_format / chat_template / template_kwargs / tool_parser: ``text`` actions or native
            ``tools`` calls, as in :class:`~.code.LocalCodeTasks`.
        memory: container memory limit (e.g. "4g"; swap is not allowed on top); nproc: pids limit;
            cpus: CPU share of one container.
        disk_bytes / disk_inodes: the workspace's tmpfs (RAM: the /testbed copies live there).
        sandbox_hosts: podman services on sandbox hosts, each a URL (``podman --url``: ``ssh://user@host/run/podman/podman.sock``,
            ``unix://``, ``tcp://``) or ``{url, capacity}`` (workspaces of this process at once; default 16).
            Each episode leases a slot on the least-loaded host that answers; its trees are bounded
            tmpfs volumes there (:mod:`..sandbox.volumes`); the image must be present on every host.
            A host that goes away ends its episodes as host faults (``rollout/failures_count``) and
            gets no new episode for 30 s. None: this host's engine. host_wait_s: how long an episode
            waits for a free slot before it fails.
        val_instance_ids / val_fraction: held-out instances for validation
            (``RolloutDataModule(val_samples=...)``): these ids, or else the instances whose id
            hashes below ``val_fraction`` (0: no split; every instance trains). Training steps draw
            only the others.
        episode_log: a path: every episode appends its phase times (container start, commands,
            verdict), reward and verdict there as a JSON line (:mod:`.episodes`). None: no log.
    """

    def __init__(
        self,
        instances: str,
        instance_ids: list[str] | None = None,
        max_turns: int = 30,
        max_action_tokens: int = 1024,
        max_observation_bytes: int = 4096,
        command_timeout_s: float = 120.0,
        eval_timeout_s: float = EVAL_TIMEOUT_S,
        engine: str = "auto",
        runtime: str = "auto",
        memory: str = "4g",
        nproc: int = 1024,
        cpus: float = 2.0,
        disk_bytes: int = 8 * 1024**3,
        disk_inodes: int = 2_000_000,
        image_override: str | None = None,
        tokenizer_path: str | None = None,
        sandbox_root: str = "/tmp/thundersync-sandboxes",
        uid_base: int = 3_700_000,
        uid_count: int = 512,
        val_instance_ids: list[str] | None = None,
        val_fraction: float = 0.0,
        action_format: ActionFormat = "text",
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        tool_parser: str = "hermes",
        sandbox_hosts: list[str | dict[str, Any]] | None = None,
        host_wait_s: float = 600.0,
        episode_log: str | None = None,
    ) -> None:
        if max_turns < 1 or max_action_tokens < 1:
            raise ConfigError("SWEbenchTasks: max_turns and max_action_tokens must be >= 1")
        if not 0.0 <= val_fraction < 1.0:
            raise ConfigError(f"SWEbenchTasks: val_fraction={val_fraction} must be in [0, 1)")
        self.val_instance_ids = list(val_instance_ids) if val_instance_ids is not None else None
        self.val_fraction = val_fraction
        self.instances_path, self.instance_ids = instances, list(instance_ids) if instance_ids else None
        self.max_turns, self.max_action_tokens = max_turns, max_action_tokens
        self.max_observation_bytes = max_observation_bytes
        self.uid_base, self.uid_count = uid_base, uid_count
        limits = SandboxLimits(timeout_s=command_timeout_s, nproc=nproc, cpus=cpus)
        self.settings = SWEbenchSettings(
            container=ContainerConfig(engine=engine, runtime=runtime, limits=limits, memory=memory),
            root=sandbox_root,
            eval_timeout_s=eval_timeout_s,
            image_override=image_override,
            disk_bytes=disk_bytes,
            disk_inodes=disk_inodes,
            hosts=parse_hosts(sandbox_hosts or ()),
            host_wait_s=host_wait_s,
        )
        if self.settings.hosts and engine not in ("auto", "podman"):
            raise ConfigError(
                f"SWEbenchTasks: sandbox_hosts are podman services; engine={engine!r} cannot reach them"
            )
        self.codec: TextCodec = HFTokenizerCodec(tokenizer_path) if tokenizer_path else ByteCodec()
        self.action_format, self.tool_parser = action_format, tool_parser
        self.renderer = tool_renderer(
            "SWEbenchTasks", action_format, tokenizer_path, chat_template, template_kwargs, tool_parser
        )
        self._rows: list[dict[str, Any]] | None = None
        self.episode_log = EpisodeLog(episode_log) if episode_log else None

    @property
    def stop_token(self) -> int | None:
        """The end of an action: the chat template's end of turn (tools) or the codec's end-of-action id."""
        return self.renderer.end_of_turn if self.renderer is not None else self.codec.end_of_action

    @property
    def rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = load_instances(self.instances_path, self.instance_ids)
        return self._rows

    def _held_out(self, row: dict[str, Any]) -> bool:
        iid = str(row["instance_id"])
        if self.val_instance_ids is not None:
            return iid in self.val_instance_ids
        return held_out(iid, self.val_fraction)

    def tasks(self, step: int, num_groups: int, seed: int) -> list[dict[str, Any]]:
        return pick([r for r in self.rows if not self._held_out(r)], step, num_groups, seed)

    def validation_tasks(self) -> list[dict[str, Any]]:
        """The held-out instances (split by instance id; see ``val_instance_ids`` / ``val_fraction``)."""
        held = [r for r in self.rows if self._held_out(r)]
        unknown = sorted(set(self.val_instance_ids or ()) - {str(r["instance_id"]) for r in self.rows})
        if unknown or not held or len(held) == len(self.rows):
            raise ConfigError(
                f"SWEbenchTasks: the split holds out {len(held)} of {len(self.rows)} instances (unknown "
                f"val_instance_ids: {unknown}); set val_instance_ids or val_fraction so both sides keep one"
            )
        return held

    def make_env(self, task: Any, seed: int) -> CodeEnv:
        if not isinstance(task, dict) or "instance_id" not in task:
            raise ConfigError("SWEbenchTasks.make_env: expected a SWE-bench instance row (dict)")
        workspace: Workspace = SWEbenchWorkspace(task, self.settings, uid_pool(self.uid_base, self.uid_count))
        if self.episode_log is not None:
            workspace = TimedWorkspace(workspace, self.episode_log, str(task["instance_id"]), seed)
        conversation = (
            None
            if self.renderer is None
            else tool_conversation(
                self.renderer, self.tool_parser, max_output_bytes=self.max_observation_bytes
            )
        )
        return CodeEnv(
            workspace, self._prompt(task), self.codec, self.max_observation_bytes, conversation=conversation
        )

    def _prompt(self, row: dict[str, Any]) -> str:
        return render_prompt(str(row["problem_statement"]), (), self.action_format)

    def max_episode_tokens(self) -> int:
        """A bound on one episode's tokens whatever the policy writes (the memory planner's): the
        longest prompt of :attr:`rows`, then per turn ``max_action_tokens`` and the observation cap
        (:func:`~..repo.tools.code_episode_tokens`, as for local code tasks)."""
        return code_episode_tokens(
            (self._prompt(r) for r in self.rows),
            max_turns=self.max_turns,
            max_action_tokens=self.max_action_tokens,
            max_observation_bytes=self.max_observation_bytes,
            codec=self.codec,
            renderer=self.renderer,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_rows"] = None
        return state
