"""A test task source: SWEbenchTasks whose rows marked ``tsl_test_apply_gold`` start with the gold
patch applied in the agent's /testbed (in the container, as the workspace uid, right after the
workspace opens), so a policy that writes nothing still submits the fix: the fit path's verdict for
a resolved instance, with every other part real."""

from __future__ import annotations

from typing import Any

from thundersync_lightning.envs.repo.episode import CodeEnv
from thundersync_lightning.envs.swebench.source import SWEbenchTasks


class _GoldFirst:
    def __init__(self, inner: Any, patch: str) -> None:
        self.inner, self.patch = inner, patch

    def open(self) -> None:
        self.inner.open()
        done = self.inner.run("git apply -", stdin=self.patch.encode(), timeout_s=120.0)
        if not done.ok:
            raise RuntimeError(f"the gold patch did not apply in the container: {done.text[-500:]}")

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class GoldPatchSWEbenchTasks(SWEbenchTasks):
    def make_env(self, task: Any, seed: int) -> CodeEnv:
        env = super().make_env(task, seed)
        if task.get("tsl_test_apply_gold"):
            env.workspace = _GoldFirst(env.workspace, str(task["patch"]))
        return env
