"""Containers die with the process that started them, even when it is SIGKILLed.

A container is run by the engine's monitor (podman's conmon, docker's daemon), not by the client
the learner starts. A learner killed by SIGKILL (the OOM killer) runs no ``finally``: the
``rm -f`` that ends every command never comes, and the container runs on until its server-side
deadline (up to the eval timeout, 30 minutes), holding its memory and CPU share.

The reaper is one watchdog process per (engine, global arguments) per learner process:

- **Death detection.** The watchdog's stdin is the read end of a pipe whose only write end the
  learner holds (close-on-exec, and closed in forked children by an ``at_fork`` hook), so
  end-of-file on it means the learner is gone, however it died. No polling, no signals.
- **Bookkeeping.** The learner writes ``+name`` before it starts a container's client and
  ``-name`` only after ``rm -f`` of that container returned. Invariant: every container of this
  learner that may exist is in the watchdog's set (a line below ``PIPE_BUF`` is written
  atomically; the pipe is read at once, so writes never wait).
- **On end-of-file** the watchdog SIGKILLs the clients still running for its names (a client that
  was still creating its container will not start it afterwards), removes those containers
  (``rm -f``; podman ``-t 0``) and whatever still carries the learner's ``tsl.owner`` label, looks
  once more for that label after a second (a docker daemon may finish a create its killed client
  asked for), and exits.
- **It must outlive the learner**: it runs in a session of its own (a signal to the learner's
  process group or terminal does not reach it) and is given no parent-death signal.
- **Volumes.** A sandbox host's workspace trees (:mod:`.volumes`) are named and labelled like
  containers; each has a holder container announced here, so the same end-of-file removes the
  owner's volumes after its containers, and the sweep removes dead owners' volumes.
- **Start-up sweep.** Every container carries ``tsl.host=<boot id>.<pid namespace>`` and
  ``tsl.owner=<host>.<pid>.<start time>`` labels and is named ``tsl-[cp-]<pid>-<start time>-<hex>``.
  When a watchdog starts it removes the containers of this host (same boot, same pid namespace)
  whose owner is gone (no such pid, or a pid reused by a later process): the leftovers of a
  learner whose watchdog was killed with it (a kill of the whole cgroup). Containers of live
  owners, of other hosts and of other pid namespaces are never touched.

This module is stdlib-only: ``python -I -S reaper.py <json>`` runs the watchdog without importing
the package (no torch, no Lightning: it starts in milliseconds).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence

__all__ = ["ContainerReaper", "container_name", "owner_labels", "reaper_for"]

log = logging.getLogger(__name__)

NAME_RE = re.compile(r"^tsl-(?:[a-z]+-)?(\d+)-(\d+)-[0-9a-f]+$")
_RM_PARALLEL = 16


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot; field 22 of /proc/<pid>/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def host_key() -> str:
    """``<boot id>.<pid namespace inode>``: pids and start times mean something only within it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")
    except OSError:
        boot = "noboot"
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{boot}.{ns}"


def _owner(pid: int | None = None) -> tuple[int, int]:
    pid = os.getpid() if pid is None else pid
    return pid, process_start(pid) or 0


def container_name(kind: str = "") -> str:
    """A fresh container name that carries its owner (this process): ``tsl-[kind-]<pid>-<start>-<hex>``."""
    pid, start = _owner()
    return f"tsl-{kind + '-' if kind else ''}{pid}-{start}-{uuid.uuid4().hex[:12]}"


def owner_labels() -> list[str]:
    """The ``--label`` arguments naming this host and this process as the container's owner."""
    host = host_key()
    pid, start = _owner()
    return ["--label", f"tsl.host={host}", "--label", f"tsl.owner={host}.{pid}.{start}"]


class ContainerReaper:
    """The learner's end of one watchdog (see the module docstring). Thread-safe."""

    def __init__(self, engine: str, global_args: Sequence[str]) -> None:
        self.engine, self.global_args = engine, list(global_args)
        self._lock = threading.Lock()
        self._live: set[str] = set()
        self._fd = -1
        self.process: subprocess.Popen[bytes] | None = None
        self._start()

    def _start(self) -> None:
        host = host_key()
        pid, start = _owner()
        spec = {
            "engine": self.engine,
            "global_args": self.global_args,
            "host": host,
            "owner": f"{host}.{pid}.{start}",
        }
        read, write = os.pipe()  # both close-on-exec: no other child inherits the write end
        try:
            self.process = subprocess.Popen(
                [sys.executable or "python3", "-I", "-S", os.path.abspath(__file__), json.dumps(spec)],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        self._fd = write

    @property
    def alive(self) -> bool:
        return self._fd >= 0 and self.process is not None and self.process.poll() is None

    def _send(self, line: str) -> None:
        data = (line + "\n").encode()
        try:
            os.write(self._fd, data)
        except OSError as e:  # the watchdog died (killed by someone): start another, tell it everything
            log.warning("container reaper %s gone (%s); starting another", self.engine, e)
            self._close_fd()
            self._start()
            os.write(self._fd, "".join(f"+{n}\n" for n in sorted(self._live)).encode() or data)

    def started(self, name: str) -> None:
        """Call before the client that creates container ``name`` starts."""
        with self._lock:
            self._live.add(name)
            self._send("+" + name)

    def finished(self, name: str) -> None:
        """Call after ``rm -f name`` returned: the container is gone."""
        with self._lock:
            self._live.discard(name)
            self._send("-" + name)

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self, wait_s: float = 30.0) -> None:
        """Hand the watchdog its end-of-file now (it removes what is still announced) and wait for it."""
        with self._lock:
            self._close_fd()
        if self.process is not None:
            try:
                self.process.wait(wait_s)
            except subprocess.TimeoutExpired:
                log.warning("container reaper %s still cleaning up after %g s", self.engine, wait_s)


_reapers: dict[tuple[str, tuple[str, ...]], ContainerReaper] = {}
_registry_lock = threading.Lock()


def reaper_for(engine: str, global_args: Sequence[str]) -> ContainerReaper:
    """This process's reaper for ``engine`` with ``global_args`` (started on first use)."""
    key = (engine, tuple(global_args))
    with _registry_lock:
        reaper = _reapers.get(key)
        if reaper is None:
            reaper = _reapers[key] = ContainerReaper(engine, global_args)
        return reaper


def _forget_after_fork() -> None:
    """In a forked child: drop the parent's write ends (else the parent's death would go unseen
    while the child lives) and its reapers; the child starts its own on first use."""
    global _registry_lock
    _registry_lock = threading.Lock()
    for reaper in _reapers.values():
        reaper._lock = threading.Lock()
        reaper._close_fd()
        reaper.process = None
    _reapers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


# ---------------------------------------------------------------- the watchdog process


def _engine(spec: dict, *args: str, timeout: float = 120.0) -> str:
    try:
        out = subprocess.run(
            [spec["engine"], *spec["global_args"], *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout


def _remove(spec: dict, names: Sequence[str]) -> None:
    """``rm -f`` each of ``names``, a bounded number at a time (one name per call: a missing name
    fails only its own call, whatever the engine's version)."""
    force = ["rm", "-f", "-t", "0"] if os.path.basename(spec["engine"]) == "podman" else ["rm", "-f"]
    names = list(names)
    for i in range(0, len(names), _RM_PARALLEL):
        procs = []
        for name in names[i : i + _RM_PARALLEL]:
            try:
                procs.append(
                    subprocess.Popen(
                        [spec["engine"], *spec["global_args"], *force, name],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            except OSError:
                continue
        for proc in procs:
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _labelled(spec: dict, label: str) -> list[str]:
    return _engine(
        spec, "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}", timeout=60
    ).split()


def _labelled_volumes(spec: dict, label: str) -> list[str]:
    if os.path.basename(spec["engine"]) != "podman":
        return []
    return _engine(
        spec, "volume", "ls", "--filter", f"label={label}", "--format", "{{.Name}}", timeout=60
    ).split()


def _remove_volumes(spec: dict, names: Sequence[str]) -> None:
    """``volume rm -f`` each of ``names`` (a sandbox host's workspace trees: their RAM with them)."""
    for name in names:
        _engine(spec, "volume", "rm", "-f", name)


def _alive(pid: int, start: int) -> bool:
    return process_start(pid) == start


def sweep_dead_owners(spec: dict) -> list[str]:
    """Remove this host's containers whose owner process is gone; their names."""

    def dead(names: list[str]) -> list[str]:
        return [
            n
            for n in names
            if (m := NAME_RE.match(n)) is not None and not _alive(int(m.group(1)), int(m.group(2)))
        ]

    containers = dead(_labelled(spec, f"tsl.host={spec['host']}"))
    _remove(spec, containers)
    volumes = dead(_labelled_volumes(spec, f"tsl.host={spec['host']}"))
    _remove_volumes(spec, volumes)  # after their holders: a volume in use is not removed
    return containers + volumes


def _clients(names: set[str]) -> list[int]:
    """Pids of this uid's processes with one of ``names`` as an argument (the engine clients)."""
    wanted = {b"\0" + n.encode() + b"\0" for n in names}
    me, uid = os.getpid(), os.getuid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = b"\0" + f.read()
        except OSError:
            continue
        if any(w in cmdline for w in wanted):
            out.append(int(entry))
    return out


def _kill_and_wait(pids: Sequence[int], wait_s: float = 10.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    for pid in pids:  # they are not our children: gone once /proc says so (or they are zombies)
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        break
            except OSError:
                break
            time.sleep(0.05)


def watch(spec: dict) -> None:
    """The watchdog: sweep dead owners, follow ``+name``/``-name`` lines, reap on end-of-file."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    # A slow engine must not stop us reading the pipe (the learner's writes would block).
    sweep = threading.Thread(target=sweep_dead_owners, args=(spec,), daemon=True)
    sweep.start()
    live: set[str] = set()
    for raw in sys.stdin.buffer:
        line = raw.decode("ascii", "replace").strip()
        if line.startswith("+"):
            live.add(line[1:])
        elif line.startswith("-"):
            live.discard(line[1:])
    if live:  # the learner died with containers running
        _kill_and_wait(_clients(live))
        owner = f"tsl.owner={spec['owner']}"
        _remove(spec, sorted(live | set(_labelled(spec, owner))))
        time.sleep(1.0)
        _remove(spec, _labelled(spec, owner))
        _remove_volumes(spec, _labelled_volumes(spec, owner))
    sweep.join(300.0)


if __name__ == "__main__":
    watch(json.loads(sys.argv[1]))
