"""What every sandbox backend shares: limits, results, and a bounded, killable process runner.

Untrusted code may print forever, never exit, ignore SIGTERM or leave daemons behind. The runner
therefore reads at most ``max_output_bytes`` from the pipe in the caller, stops at a deadline, and
always SIGKILLs the whole process group it started before returning; backends add the isolation
that makes "the process group" mean "everything the code started" (a pid namespace for bwrap, a
container for podman/docker).
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ...core.errors import ConfigError, HostFault, ThunderSyncError

__all__ = [
    "SandboxError",
    "InvalidCommand",
    "check_command",
    "SandboxLimits",
    "SandboxResult",
    "Sandbox",
    "RunGuard",
    "run_bounded",
    "wait_readable",
    "kill_group",
]

_TRUNCATED = b"\n[output truncated]\n"


class SandboxError(ThunderSyncError):
    """A sandbox could not be set up or used (missing tool, bad configuration, closed sandbox)."""


class InvalidCommand(SandboxError, ValueError):
    """A command no process can be given (a NUL byte, text that is not UTF-8, past the kernel's
    argument limit): the model wrote it, so callers answer it as an invalid action."""


MAX_COMMAND_BYTES = 100_000  # below the kernel's limit on one argument (MAX_ARG_STRLEN, 128 KiB)


def check_command(command: object) -> bytes:
    """``command`` as the bytes a shell receives; :class:`InvalidCommand` saying why it cannot be one.

    Checked before any process starts: ``Popen`` would raise on the host for each of these."""
    if not isinstance(command, str):
        raise InvalidCommand(f"a command must be text, got {type(command).__name__}")
    try:
        data = command.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidCommand(
            f"the command is not valid UTF-8 text ({exc.reason} at character {exc.start})"
        ) from None
    nul = data.find(0)
    if nul >= 0:
        raise InvalidCommand(f"the command contains a NUL byte (at byte {nul})")
    if len(data) > MAX_COMMAND_BYTES:
        raise InvalidCommand(f"the command is {len(data)} bytes; at most {MAX_COMMAND_BYTES}")
    return data


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """Per-command resource limits. Byte counts are plain integers (prlimit rejects suffixes)."""

    timeout_s: float = 30.0
    max_output_bytes: int = 64 * 1024
    nproc: int = 256
    memory_bytes: int = (
        2 * 1024**3
    )  # the whole command's memory (cgroup; tmpfs included) and each process's address space
    fsize_bytes: int = 64 * 1024**2
    nofile: int = 1024
    tmpfs_bytes: int = 256 * 1024**2
    cpus: float = 1.0  # CPU time per wall second for the whole command (cgroup cpu.max / --cpus)
    dev_bytes: int = 8 * 1024**2  # the sandbox's private /dev (a tmpfs: /dev/shm lives there)
    disk_bytes: int = 1024**3  # the workspace's disk budget (a tmpfs of its own; see sandbox.fs)
    disk_inodes: int = 100_000  # the workspace's inode budget

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)!r} must be > 0"
            for name in (
                "timeout_s",
                "max_output_bytes",
                "nproc",
                "memory_bytes",
                "fsize_bytes",
                "nofile",
                "tmpfs_bytes",
                "cpus",
                "dev_bytes",
                "disk_bytes",
                "disk_inodes",
            )
            if not getattr(self, name) > 0
        ]
        if problems:
            raise ConfigError("invalid SandboxLimits: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """Outcome of one command. ``exit_code`` is None when the command was killed by us."""

    exit_code: int | None
    output: bytes  # stdout and stderr interleaved, at most max_output_bytes (+ a truncation note)
    timed_out: bool = False
    truncated: bool = False
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.truncated and not self.cancelled

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", errors="replace")


class RunGuard:
    """Counts the in-flight runs of one owner (a workspace) and cancels them all at once.

    ``cancel()`` kills every run in flight (each run watches the guard's pipe in its select loop,
    so cancellation is immediate, not polled), refuses new ones, and waits until the in-flight
    runs have returned, i.e. until their processes are dead: only then may the owner reuse the
    uid or delete the directories.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        self._cond = threading.Condition()
        self._active = 0
        self.cancelled = False

    @property
    def fd(self) -> int:
        return self._read

    def enter(self) -> None:
        with self._cond:
            if self.cancelled:
                raise SandboxError("sandbox run after close(): the sandbox was cancelled")
            self._active += 1

    def exit(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def cancel(self, wait_s: float = 120.0) -> bool:
        """Kill in-flight runs and wait for them; True when none is left. Idempotent."""
        with self._cond:
            if not self.cancelled:
                self.cancelled = True
                os.write(self._write, b"x")
            done = self._cond.wait_for(lambda: self._active == 0, timeout=wait_s)
            if done and self._write >= 0:
                os.close(self._read)
                os.close(self._write)
                self._read = self._write = -1
            return done

    def __del__(self) -> None:
        for fd in (getattr(self, "_read", -1), getattr(self, "_write", -1)):
            if fd >= 0:
                os.close(fd)


@runtime_checkable
class Sandbox(Protocol):
    """Runs shell commands with a private writable working directory (``/testbed`` inside)."""

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None
    ) -> SandboxResult: ...

    def close(self) -> None: ...


class _BoundedReader:
    """Non-blocking reads from a pipe, keeping at most ``cap`` bytes."""

    def __init__(self, fd: int, cap: int) -> None:
        self.fd, self.cap = fd, cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.eof = self.truncated = False
        os.set_blocking(fd, False)

    @property
    def done(self) -> bool:
        return self.eof or self.truncated

    def read(self) -> bool:
        """One read; False when nothing was available right now."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        if not data:
            self.eof = True
            return False
        room = self.cap - self.size
        if len(data) > room:
            self.truncated = True
        data = data[:room]
        self.chunks.append(data)
        self.size += len(data)
        return True

    def drain(self) -> None:
        while not self.done and self.read():
            pass


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
    except (BrokenPipeError, ValueError, OSError):
        pass
    finally:
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass


def wait_readable(fds: Sequence[int], timeout_s: float) -> list[int]:
    """The fds of ``fds`` that are readable (or hung up) within ``timeout_s``; poll(2), so any fd
    number works (``select()`` fails beyond FD_SETSIZE = 1024)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    ms = max(0, int(timeout_s * 1000 + 0.999))
    return [fd for fd, _ in poller.poll(ms)]


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (breadth first), from /proc/<pid>/task/*/children."""
    out: list[int] = []
    frontier = [pid]
    while frontier:
        nxt: list[int] = []
        for p in frontier:
            try:
                tasks = os.listdir(f"/proc/{p}/task")
            except OSError:
                continue
            for t in tasks:
                try:
                    with open(f"/proc/{p}/task/{t}/children") as f:
                        nxt.extend(int(c) for c in f.read().split())
                except OSError:
                    continue
        out.extend(nxt)
        frontier = nxt
    return out


def kill_group(proc: subprocess.Popen[bytes], wait_s: float = 30.0) -> None:
    """SIGKILL the group and every descendant, then wait until those descendants are gone.

    Call only while the leader is not yet reaped (its pid cannot be reused). Killing is
    asynchronous: a pid namespace's init dies only after the kernel reaped everything inside it,
    so waiting for the descendants (pidfds, no polling) means nothing the command started lives on.
    """
    victims = _descendants(proc.pid)
    pidfds = []
    for pid in victims:
        try:
            pidfds.append(os.pidfd_open(pid))
        except OSError:
            continue
    try:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for fd in pidfds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        for fd in pidfds:
            wait_readable([fd], max(0.0, deadline - time.monotonic()))
    finally:
        for fd in pidfds:
            os.close(fd)


def run_bounded(
    argv: Sequence[str],
    *,
    timeout_s: float,
    max_output_bytes: int,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
    on_start: Callable[[], None] | None = None,
    guard: RunGuard | None = None,
) -> SandboxResult:
    """Run ``argv`` in a new session; return at most ``max_output_bytes`` of its merged output.

    The process group is SIGKILLed when the deadline passes, when the output cap is reached, and in
    every case before returning, together with every descendant still attached to it (backends
    put the rest in a pid namespace or container tied to the leader). ``on_start`` runs right
    after the process started; ``pass_fds`` are inherited by it. A cancelled ``guard`` kills the
    run at once (``cancelled`` in the result). Counting runs (``guard.enter/exit``) is the
    caller's job, around everything its run must finish (waiting for a namespace, removing a
    container).
    """
    if guard is not None and guard.cancelled:
        return SandboxResult(exit_code=None, output=b"[cancelled: the sandbox was closed]\n", cancelled=True)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            pass_fds=tuple(pass_fds),
        )
    except (OSError, ValueError) as exc:  # the command was checked (check_command): the host failed
        raise HostFault(f"could not start {argv[0]!r}: {type(exc).__name__}: {exc}") from exc
    assert proc.stdout is not None
    if on_start is not None:
        on_start()
    reader = _BoundedReader(proc.stdout.fileno(), max_output_bytes)
    timed_out = cancelled = False
    deadline = time.monotonic() + timeout_s
    # A pidfd turns readable when the leader exits, without reaping it: until we reap, its pid
    # (and so its process group id) cannot be reused, which makes the final killpg safe.
    pidfd = os.pidfd_open(proc.pid)
    try:
        if stdin is not None:  # a thread, so a child that writes before reading cannot deadlock us
            threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
        with selectors.PollSelector() as sel:  # never select(): the host may hold > 1024 fds
            sel.register(reader.fd, selectors.EVENT_READ)
            sel.register(pidfd, selectors.EVENT_READ)
            if guard is not None:
                sel.register(guard.fd, selectors.EVENT_READ)
            exited = False
            while not exited and not reader.done and not cancelled:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(timeout=min(left, 1.0)):
                    if key.fd == pidfd:
                        exited = True
                    elif guard is not None and key.fd == guard.fd:
                        cancelled = True
                    elif not reader.done:
                        reader.read()
                        if reader.done:
                            sel.unregister(reader.fd)
            if exited:
                reader.drain()  # what the group wrote before it ended; never waits
            elif reader.eof and not reader.truncated and not cancelled:
                # Output closed but the leader runs on: wait for it until the deadline.
                left = deadline - time.monotonic()
                fds = [pidfd] + ([guard.fd] if guard is not None else [])
                ready = wait_readable(fds, max(0.0, left))
                if pidfd not in ready:
                    timed_out, cancelled = not ready, bool(ready)
    finally:
        kill_group(proc)
        os.close(pidfd)
        proc.wait()
        proc.stdout.close()
    exit_code = None if (timed_out or cancelled or reader.truncated) else proc.returncode
    output = b"".join(reader.chunks)
    if reader.truncated:
        output += _TRUNCATED
    if timed_out:
        output += f"\n[timed out after {timeout_s:g} s]\n".encode()
    if cancelled:
        output += b"\n[cancelled: the sandbox was closed]\n"
    return SandboxResult(
        exit_code=exit_code,
        output=output,
        timed_out=timed_out,
        truncated=reader.truncated,
        cancelled=cancelled,
    )
