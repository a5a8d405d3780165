"""What every sandbox backend shares: limits, results, and a bounded, killable process runner.

Untrusted code may print forever, never exit, ignore SIGTERM or leave daemons behind. The runner
therefore reads at most ``max_output_bytes`` from the pipe in the caller, stops at a deadline, and
always SIGKILLs the whole process group it started before returning; backends add the isolation
that makes "the process group" mean "everything the code started" (a pid namespace for bwrap, a
container for podman/docker).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ...core.errors import ThunderSyncError

__all__ = ["SandboxError", "SandboxLimits", "SandboxResult", "Sandbox", "run_bounded"]

_TRUNCATED = b"\n[output truncated]\n"


class SandboxError(ThunderSyncError):
    """A sandbox could not be set up or used (missing tool, bad configuration, closed sandbox)."""


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Per-command resource limits. Byte counts are plain integers (prlimit rejects suffixes)."""

    timeout_s: float = 30.0
    max_output_bytes: int = 64 * 1024
    nproc: int = 256
    memory_bytes: int = 2 * 1024**3  # address space per process (bwrap) / cgroup memory (container)
    fsize_bytes: int = 64 * 1024**2
    nofile: int = 1024
    tmpfs_bytes: int = 256 * 1024**2

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)!r} must be > 0"
            for name in ("timeout_s", "max_output_bytes", "nproc", "memory_bytes", "fsize_bytes", "nofile")
            if not getattr(self, name) > 0
        ]
        if problems:
            raise SandboxError("invalid SandboxLimits: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """Outcome of one command. ``exit_code`` is None when the command was killed by us."""

    exit_code: int | None
    output: bytes  # stdout and stderr interleaved, at most max_output_bytes (+ a truncation note)
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", errors="replace")


@runtime_checkable
class Sandbox(Protocol):
    """Runs shell commands with a private writable working directory (``/testbed`` inside)."""

    def run(self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None) -> SandboxResult: ...

    def close(self) -> None: ...


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bounded(
    argv: Sequence[str],
    *,
    timeout_s: float,
    max_output_bytes: int,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> SandboxResult:
    """Run ``argv`` in a new session; return at most ``max_output_bytes`` of its merged output.

    The process group is SIGKILLed when the deadline passes, when the output cap is reached, and in
    every case before returning (a group leader that already exited leaves nothing to kill, which
    is fine: backends put everything else in a pid namespace or container tied to the leader).
    """
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )
    assert proc.stdout is not None
    chunks: list[bytes] = []
    size = 0
    timed_out = truncated = False
    deadline = time.monotonic() + timeout_s
    try:
        if stdin is not None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(stdin)
                proc.stdin.close()
            except BrokenPipeError:
                pass
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                if not sel.select(timeout=min(left, 1.0)):
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    break
                room = max_output_bytes - size
                chunks.append(data[:room])
                size += min(len(data), room)
                if len(data) > room:
                    truncated = True
                    break
        if timed_out or truncated:
            _kill_group(proc)
        left = max(0.0, deadline - time.monotonic())
        try:
            exit_code: int | None = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            proc.wait()
            exit_code = None
        if timed_out or truncated:
            exit_code = None
    finally:
        _kill_group(proc)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    output = b"".join(chunks)
    if truncated:
        output += _TRUNCATED
    if timed_out:
        output += f"\n[timed out after {timeout_s:g} s]\n".encode()
    return SandboxResult(exit_code=exit_code, output=output, timed_out=timed_out, truncated=truncated)
