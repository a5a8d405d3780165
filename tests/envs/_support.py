"""Helpers shared by the code-environment tests."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from thundersync_lightning.envs.sandbox import UidPool, bwrap_available

# Tests use their own uid range (leases are exclusive across processes anyway).
TEST_POOL = UidPool(base=3_900_000, size=256)

needs_bwrap = pytest.mark.skipif(
    not bwrap_available(),
    reason="needs root and bubblewrap (apt-get install bubblewrap; `make test` does it)",
)


def processes_of(uid: int) -> list[int]:
    """Pids of live (non-zombie) host processes whose real uid is ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 ").split()[0]) == uid and not fields.get("State", "").strip().startswith(
            "Z"
        ):
            pids.append(int(entry))
    return pids


def processes_of_tag(tag: str) -> list[int]:
    """Pids of host processes whose command line contains ``tag``."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if tag.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


def swebench_row(task, image: str, base_commit: str) -> dict:
    """A SWE-bench (swebench 5 schema) row for a local task whose repository sits at /testbed."""
    files = " ".join(task.test_files)
    eval_script = (
        "\n".join(
            [
                "#!/bin/bash",
                "set -uxo pipefail",
                "cd /testbed",
                f"git -c core.hooksPath=/dev/null checkout {base_commit} -- {files}",
                ": '>>>>> Start Test Output'",
                f"python3 -m pytest -rA -p no:cacheprovider {files}",
                ": '>>>>> End Test Output'",
                f"git checkout {base_commit} -- {files}",
            ]
        )
        + "\n"
    )
    return {
        "instance_id": f"local__{task.name}-1",
        "repo": f"local/{task.name}",
        "base_commit": base_commit,
        "patch": task.gold_patch,
        "test_patch": "",
        "problem_statement": task.problem_statement,
        "hints_text": "",
        "created_at": "2026-11-29T00:00:00Z",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(list(task.fail_to_pass)),
        "PASS_TO_PASS": json.dumps(list(task.pass_to_pass)),
        "environment_setup_commit": base_commit,
        "image": image,
        "eval_script": eval_script,
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }


def git_repo(task, dest: str) -> str:
    """Materialize ``task`` in ``dest`` as a git repository with one deterministic commit; its sha."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": dest,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    }
    task.materialize(dest)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", *args], cwd=dest, env=env, check=True, capture_output=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=dest, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
