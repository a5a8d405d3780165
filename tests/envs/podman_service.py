"""A podman service on a unix socket, started by a test: the stand-in for a sandbox host.

The service runs on this machine (the same storage and images as the local engine), but the
learner reaches it only through ``podman --url``: every path a remote host takes (no host binds,
volumes, the remote client's faults) runs for real. ``kill()`` SIGKILLs it, as a host that goes away.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time

from thundersync_lightning.envs.sandbox.hosts import probe

RUNC = "/usr/sbin/runc"
START_S = 60.0


class PodmanService:
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.dir = tempfile.mkdtemp(prefix="tsl-podman-svc-")
        self.url = f"unix://{self.dir}/podman.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        runtime = ["--runtime", RUNC] if os.path.exists(RUNC) else []
        self.proc = subprocess.Popen(
            [self.engine, *runtime, "system", "service", "--time=0", self.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_S
        while (
            why := probe(self.engine, self.url, 5.0)
        ) is not None:  # the socket answers (its own state, polled)
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman service at {self.url} did not start: {why}")
            time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def pause(self, paused: bool = True) -> None:
        """SIGSTOP (SIGCONT) the service: a host that hangs rather than goes away."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def leftovers(self, label: str) -> tuple[list[str], list[str]]:
        """Containers and volumes carrying ``label``, as the local engine sees them (same storage)."""
        runtime = ["--runtime", RUNC] if os.path.exists(RUNC) else []
        ps = subprocess.run(
            [self.engine, *runtime, "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
        vols = subprocess.run(
            [self.engine, *runtime, "volume", "ls", "--filter", f"label={label}", "--format", "{{.Name}}"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split()
        return ps, vols

    def remove(self, label: str) -> None:
        """Remove what carries ``label`` through the local engine (a killed service removes nothing)."""
        runtime = ["--runtime", RUNC] if os.path.exists(RUNC) else []
        ps, vols = self.leftovers(label)
        for name in ps:
            subprocess.run(
                [self.engine, *runtime, "rm", "-f", "-t", "0", name], capture_output=True, timeout=120
            )
        for name in vols:
            subprocess.run(
                [self.engine, *runtime, "volume", "rm", "-f", name], capture_output=True, timeout=120
            )

    def close(self) -> None:
        self.pause(False)
        self.kill()
        subprocess.run(["rm", "-rf", self.dir], check=False)
