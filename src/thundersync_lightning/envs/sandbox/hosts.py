"""Sandbox hosts: podman services on other machines, each with a capacity, and what a lost one costs.

A learner node's CPUs are few next to what SWE-style RL runs at once (hundreds of test runs), so
episodes may run on sandbox hosts: machines running ``podman system service`` that the learner
reaches with ``podman --url`` (``ssh://`` in production, ``unix://`` on one machine, ``tcp://`` on
a trusted network). Each :class:`ContainerHost` takes at most ``capacity`` workspaces of this
learner process at once; :class:`HostPool` leases a slot on the least-loaded host that answers.

Faults: a host that stops answering is found out by the command that failed (the remote client
exits 125, or hangs until its deadline) and a :func:`probe` of the service; that command raises
:class:`~...core.errors.HostFault` (its episode ends as a failure no action caused, counted in the
step's ``rollout/failures_count``) and the host is marked down for :data:`DOWN_S` seconds: new
workspaces go to the other hosts meanwhile, then it is probed again. Exit status 125 alone proves
nothing (agent code can ``exit 125``): only a failed probe makes a fault.

Invariant: every lease is released exactly once (``close()`` of its workspace), so a host's count
never drifts; capacities count this process's workspaces only (each data-parallel rank leases on
its own: give each rank its share).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError, HostFault

__all__ = [
    "URL_SCHEMES",
    "ContainerHost",
    "HostLease",
    "HostPool",
    "host_fault",
    "host_pool",
    "parse_hosts",
    "probe",
]

URL_SCHEMES = ("unix://", "ssh://", "tcp://")  # what ``podman --url`` takes

DOWN_S = 30.0  # how long a host that failed its probe gets no new workspace
PROBE_S = 10.0  # a probe's own deadline (an ssh dial to a vanished machine may take minutes)

_down: dict[str, tuple[float, str]] = {}
_down_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class ContainerHost:
    """One podman service: ``url`` as ``podman --url`` takes it; ``capacity``: workspaces at once."""

    url: str
    capacity: int = 16

    def __post_init__(self) -> None:
        if not self.url.startswith(URL_SCHEMES):
            raise ConfigError(
                f"sandbox host url={self.url!r}: expected unix://, ssh:// or tcp:// (podman --url)"
            )
        if self.capacity < 1:
            raise ConfigError(f"sandbox host {self.url}: capacity={self.capacity} must be >= 1")


def parse_hosts(hosts: Sequence[str | Mapping[str, Any] | ContainerHost]) -> tuple[ContainerHost, ...]:
    """``hosts`` from a config: URLs, ``{url, capacity}`` mappings or :class:`ContainerHost` s."""
    out = []
    for i, h in enumerate(hosts):
        if isinstance(h, ContainerHost):
            out.append(h)
        elif isinstance(h, str):
            out.append(ContainerHost(h))
        elif isinstance(h, Mapping):
            unknown = sorted(set(h) - {"url", "capacity"})
            if unknown or "url" not in h:
                raise ConfigError(f"sandbox_hosts[{i}]: expected {{url, capacity}}, got keys {sorted(h)}")
            capacity = h.get("capacity", 16)
            if not isinstance(capacity, int) or isinstance(capacity, bool):
                raise ConfigError(f"sandbox_hosts[{i}]: capacity={capacity!r} must be a whole number")
            out.append(ContainerHost(str(h["url"]), capacity))
        else:
            raise ConfigError(
                f"sandbox_hosts[{i}]: expected a URL or {{url, capacity}}, got {type(h).__name__}"
            )
    urls = [h.url for h in out]
    if len(set(urls)) != len(urls):
        raise ConfigError(f"sandbox_hosts: a URL is listed twice: {urls}")
    return tuple(out)


def probe(engine: str, url: str, timeout_s: float = PROBE_S) -> str | None:
    """None when the podman service at ``url`` answers; else why not."""
    try:
        done = subprocess.run(
            [engine, "--url", url, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    if done.returncode != 0 or not done.stdout.strip():
        return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][-300:]
    return None


def host_fault(url: str, why: str) -> HostFault:
    """Mark ``url`` down (see :data:`DOWN_S`) and return the fault to raise."""
    with _down_lock:
        _down[url] = (time.monotonic() + DOWN_S, why)
    return HostFault(f"sandbox host {url} went away: {why}")


def _down_reason(url: str) -> str | None:
    with _down_lock:
        mark = _down.get(url)
        if mark is None or mark[0] <= time.monotonic():
            _down.pop(url, None)
            return None
        return mark[1]


@dataclass(slots=True)
class HostLease:
    """A workspace's slot on ``host``; :meth:`release` once (later calls do nothing)."""

    host: ContainerHost
    _pool: HostPool | None

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._release(self.host)


class HostPool:
    """Slots on ``hosts``: :meth:`acquire` takes one on the least-loaded host that is up."""

    def __init__(self, engine: str, hosts: Sequence[ContainerHost]) -> None:
        if not hosts:
            raise ConfigError("HostPool: no sandbox host")
        self.engine, self.hosts = engine, tuple(hosts)
        self._used = {h.url: 0 for h in self.hosts}
        self._cond = threading.Condition()

    def used(self, url: str) -> int:
        with self._cond:
            return self._used[url]

    def acquire(self, wait_s: float = 600.0) -> HostLease:
        """A slot on a host that answers its probe; waits up to ``wait_s`` for a free one.
        :class:`HostFault` when every host is down (each one's reason named) or all stayed full."""
        deadline = time.monotonic() + wait_s
        while True:
            host = self._take(deadline, wait_s)
            why = probe(self.engine, host.url)
            if why is None:
                return HostLease(host, self)
            host_fault(host.url, why)  # marked down: the next pick is another host, or the error
            self._release(host)

    def _take(self, deadline: float, wait_s: float) -> ContainerHost:
        with self._cond:
            while True:
                down = {h.url: why for h in self.hosts if (why := _down_reason(h.url)) is not None}
                free = [h for h in self.hosts if h.url not in down and self._used[h.url] < h.capacity]
                if free:
                    host = min(free, key=lambda h: (self._used[h.url] / h.capacity, self._used[h.url]))
                    self._used[host.url] += 1
                    return host
                if len(down) == len(self.hosts):
                    raise HostFault(
                        "every sandbox host is down: " + "; ".join(f"{u}: {w}" for u, w in down.items())
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HostFault(
                        f"every sandbox host stayed full for {wait_s:g} s: "
                        + ", ".join(f"{h.url} {self._used[h.url]}/{h.capacity}" for h in self.hosts)
                    )
                self._cond.wait(min(left, DOWN_S))  # a released slot wakes us; a down mark expires

    def _release(self, host: ContainerHost) -> None:
        with self._cond:
            self._used[host.url] -= 1
            self._cond.notify_all()


_pools: dict[tuple[str, tuple[ContainerHost, ...]], HostPool] = {}
_pools_lock = threading.Lock()


def host_pool(engine: str, hosts: Sequence[ContainerHost]) -> HostPool:
    """One pool per (engine, hosts) per process: every task source with these hosts shares the slots."""
    key = (engine, tuple(hosts))
    with _pools_lock:
        if key not in _pools:
            _pools[key] = HostPool(engine, hosts)
        return _pools[key]
