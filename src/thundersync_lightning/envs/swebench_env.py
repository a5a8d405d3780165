"""SWE-bench: instances from a local file, the agent loop in the instance's image, swebench grading.

Instances are rows in swebench's schema (``load_swebench_dataset`` on a local .json/.jsonl/.parquet;
swebench >= 5 rows carry ``image``, ``eval_script``, ``log_parser`` and ``eval_type``). The image's
``/testbed`` is copied to a host directory owned by a pool uid; every agent command runs in a fresh,
locked-down container of the image with that directory bound at /testbed (see
:mod:`..sandbox.container`). The verdict takes the agent's diff against ``base_commit``, drops
changes to test files (those the instance's ``test_patch`` touches, and any protected path), applies
it to a fresh copy of /testbed, runs the instance's eval script there, and grades the log with
``make_test_spec`` + ``get_eval_report``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.errors import ConfigError
from .code.codec import ByteCodec, HFTokenizerCodec, TextCodec
from .code.env import CodeEnv, render_prompt
from .code.grading import EvalOutcome, filter_patch, grade_with_spec, split_patch
from .code.source import pick, uid_pool
from .code.task import is_protected_path
from .code.workspace import DIFF_COMMAND
from .sandbox.base import RunGuard, SandboxError, SandboxLimits, SandboxResult
from .sandbox.bwrap import chown_tree
from .sandbox.container import ContainerConfig, ContainerSandbox, copy_from_image
from .sandbox.uids import UidLease, UidPool

__all__ = ["SWEbenchSettings", "SWEbenchWorkspace", "SWEbenchTasks", "load_instances"]

_APPLY = ("git apply --verbose --whitespace=nowarn - || "
          "(echo 'git apply failed; trying patch' && patch --batch --fuzz=5 -p1)")


def load_instances(path: str, instance_ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a local swebench file, checked for the fields grading needs."""
    if not os.path.isfile(path):
        raise ConfigError(f"SWE-bench instance file {path!r} does not exist (a local .json/.jsonl/.parquet)")
    from swebench.harness.utils import load_swebench_dataset

    rows = [dict(r) for r in load_swebench_dataset(path, instance_ids=instance_ids)]
    need = ("instance_id", "image", "eval_script", "log_parser", "eval_type", "FAIL_TO_PASS",
            "PASS_TO_PASS", "problem_statement", "repo", "version")
    problems = [f"{r.get('instance_id', '?')}: missing {k}" for r in rows for k in need if k not in r]
    if problems:
        raise ConfigError("SWE-bench rows lack fields swebench 5 grading needs: " + "; ".join(problems[:10]))
    if not rows:
        raise ConfigError(f"no instances in {path!r}")
    return rows


@dataclass(frozen=True, slots=True)
class SWEbenchSettings:
    container: ContainerConfig = field(default_factory=ContainerConfig)
    root: str = "/tmp/thundersync-sandboxes"
    eval_timeout_s: float = 1800.0
    max_patch_bytes: int = 4 * 1024 * 1024
    max_log_bytes: int = 16 * 1024 * 1024
    image_override: str | None = None  # run every instance in this image (tests, mirrors)


class SWEbenchWorkspace:
    """One instance's /testbed on the host, acted on and graded in containers of its image."""

    def __init__(self, instance: dict[str, Any], settings: SWEbenchSettings, pool: UidPool) -> None:
        self.instance, self.settings, self.pool = instance, settings, pool
        self.image = settings.image_override or str(instance["image"])
        self._lease: UidLease | None = None
        self._dir: str | None = None
        self._sandbox: ContainerSandbox | None = None
        self._base = str(instance.get("base_commit") or "HEAD")
        self._guard = RunGuard()  # shared by every container of this workspace: close() stops them all
        test_patch = str(instance.get("test_patch") or "")
        self._test_paths = frozenset(p for paths, _ in split_patch(test_patch) for p in paths)

    def _fresh_testbed(self, dest: str, uid: int) -> None:
        copy_from_image(self.image, "/testbed", dest, self.settings.container)
        chown_tree(dest, uid)

    def _box(self, workdir: str, cap: int | None = None) -> ContainerSandbox:
        assert self._lease is not None
        config = self.settings.container
        if cap is not None:
            config = replace(config, limits=replace(config.limits, max_output_bytes=cap))
        return ContainerSandbox(workdir, self.image, self._lease.uid, config, guard=self._guard)

    def open(self) -> None:
        if self._sandbox is not None:
            return
        os.makedirs(self.settings.root, mode=0o711, exist_ok=True)
        lease = self.pool.acquire()
        try:
            self._dir = tempfile.mkdtemp(prefix="swe-", dir=self.settings.root)
            os.chmod(self._dir, 0o711)
            agent = os.path.join(self._dir, "agent")
            self._fresh_testbed(agent, lease.uid)
            self._lease = lease
            self._sandbox = self._box(agent)
        except BaseException:
            lease.release()
            self._lease = None
            self.close()
            raise

    def run(self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None) -> SandboxResult:
        if self._sandbox is None:
            raise SandboxError("SWEbenchWorkspace.run before open() or after close()")
        return self._sandbox.run(command, stdin=stdin, timeout_s=timeout_s)

    def diff(self) -> str | None:
        if self._sandbox is None:
            raise SandboxError("SWEbenchWorkspace.diff before open() or after close()")
        box = self._box(self._sandbox.workdir, self.settings.max_patch_bytes)
        result = box.run(DIFF_COMMAND.format(base=self._base), timeout_s=120.0)
        return result.text if result.ok else None

    def protects(self, path: str) -> bool:
        """Files the instance's test patch touches, and every test/test-configuration path."""
        return path in self._test_paths or is_protected_path(path)

    def evaluate(self, patch: str) -> EvalOutcome:
        if self._lease is None or self._dir is None:
            raise SandboxError("SWEbenchWorkspace.evaluate before open() or after close()")
        from swebench.harness.constants import APPLY_PATCH_FAIL, APPLY_PATCH_PASS
        from swebench.harness.utils import make_test_spec

        patch = filter_patch(patch, self.protects)
        if not patch.strip():
            return EvalOutcome(False, "empty patch (after dropping changes to tests)")
        spec = make_test_spec(self.instance)
        evaldir = os.path.join(tempfile.mkdtemp(prefix="eval-", dir=self._dir), "testbed")
        try:
            self._fresh_testbed(evaldir, self._lease.uid)
            box = self._box(evaldir, self.settings.max_log_bytes)
            applied = box.run(_APPLY, stdin=patch.encode(), timeout_s=120.0)
            if not applied.ok:
                return EvalOutcome(False, "patch did not apply", log=f"{APPLY_PATCH_FAIL}\n{applied.text}")
            result = box.run("cat > /tmp/eval.sh && /bin/bash /tmp/eval.sh", stdin=spec.eval_script.encode(),
                             timeout_s=self.settings.eval_timeout_s)
            log = f"{APPLY_PATCH_PASS}\n{result.text}"
            if result.timed_out or result.truncated:
                from swebench.harness.constants import TESTS_ERROR, TESTS_TIMEOUT

                log += f"\n{TESTS_TIMEOUT if result.timed_out else TESTS_ERROR}\n"
            return grade_with_spec(spec, log, patch)
        finally:
            shutil.rmtree(os.path.dirname(evaldir), ignore_errors=True)

    def close(self) -> None:
        """Kill whatever still runs (a verdict past its timeout included), then free dirs and uid."""
        if not self._guard.cancel():
            return  # a run refuses to die: keep its uid and directory rather than hand them on
        self._sandbox = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self._lease is not None:
            self._lease.release()
            self._lease = None


class SWEbenchTasks:
    """TaskSource over a local SWE-bench file (needs podman or a running docker, and the images).

    Args:
        instances: path of a .json/.jsonl/.parquet file in swebench's schema.
        instance_ids: only these instances.
        engine: "podman", "docker" or "auto". runtime: podman OCI runtime ("auto": runc if present).
        image_override: one local image for every instance (instead of each row's ``image``).
        tokenizer_path: a local HF tokenizer directory; None = the byte-level codec.
        memory: container memory limit (e.g. "4g"); nproc: pids limit.
    """

    def __init__(
        self,
        instances: str,
        instance_ids: list[str] | None = None,
        max_turns: int = 30,
        max_action_tokens: int = 1024,
        max_observation_bytes: int = 4096,
        command_timeout_s: float = 120.0,
        eval_timeout_s: float = 1800.0,
        engine: str = "auto",
        runtime: str = "auto",
        memory: str = "4g",
        nproc: int = 1024,
        image_override: str | None = None,
        tokenizer_path: str | None = None,
        sandbox_root: str = "/tmp/thundersync-sandboxes",
        uid_base: int = 3_700_000,
        uid_count: int = 512,
    ) -> None:
        if max_turns < 1 or max_action_tokens < 1:
            raise ConfigError("SWEbenchTasks: max_turns and max_action_tokens must be >= 1")
        self.instances_path, self.instance_ids = instances, list(instance_ids) if instance_ids else None
        self.max_turns, self.max_action_tokens = max_turns, max_action_tokens
        self.max_observation_bytes = max_observation_bytes
        self.uid_base, self.uid_count = uid_base, uid_count
        limits = SandboxLimits(timeout_s=command_timeout_s, nproc=nproc)
        self.settings = SWEbenchSettings(
            container=ContainerConfig(engine=engine, runtime=runtime, limits=limits, memory=memory),
            root=sandbox_root, eval_timeout_s=eval_timeout_s, image_override=image_override,
        )
        self.codec: TextCodec = HFTokenizerCodec(tokenizer_path) if tokenizer_path else ByteCodec()
        self._rows: list[dict[str, Any]] | None = None

    @property
    def stop_token(self) -> int | None:
        """The codec's end-of-action id (a tokenizer is loaded on first use)."""
        return self.codec.end_of_action

    @property
    def rows(self) -> list[dict[str, Any]]:
        if self._rows is None:
            self._rows = load_instances(self.instances_path, self.instance_ids)
        return self._rows

    def tasks(self, step: int, num_groups: int, seed: int) -> list[dict[str, Any]]:
        return pick(self.rows, step, num_groups, seed)

    def make_env(self, task: Any, seed: int) -> CodeEnv:
        del seed
        if not isinstance(task, dict) or "instance_id" not in task:
            raise ConfigError("SWEbenchTasks.make_env: expected a SWE-bench instance row (dict)")
        workspace = SWEbenchWorkspace(task, self.settings, uid_pool(self.uid_base, self.uid_count))
        return CodeEnv(workspace, render_prompt(str(task["problem_statement"])), self.codec,
                       self.max_observation_bytes)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_rows"] = None
        return state
