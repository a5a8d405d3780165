"""A :class:`RolloutEngine` whose generation runs on vLLM servers on other machines (``vllm serve``).

The learner keeps what is agent-side: episodes run in the engine-agnostic
:class:`~thundersync_lightning.rollout.agent.loop.AgentLoop` (environments in this process's
thread pool), and each turn of each episode is one HTTP request, token ids in and out
(:mod:`.server_client`), seeded with ``turn_seed(derive_seed(seed, step, group, sample),
turn)`` exactly as the in-process :class:`~.engine.VLLMEngine` seeds it. The servers run with
``--logprobs-mode processed_logprobs``, so the logprobs are those of the sampled distribution,
log_softmax(z / T), the quantity the learner recomputes. Requests spread over the servers and
many are in flight on each (:mod:`.server_fleet`).

Weight sync (``publish``): names and shapes are checked first (nothing changes on error); the
publish waits until every earlier request has finished generating (a publish issued after
``rollout(r1)`` applies to ``r2`` only), then broadcasts the state dict in buckets into every live
server's workers and labels their weights with the version (:mod:`.server_publish`). Every
response names the version it was sampled with; a response of another version is refused
(:class:`~.server_fleet.StaleResponse`), so staleness 0 holds across the network.

Learner ranks: rank r of N uses the servers ``urls[r::N]`` and publishes into them alone (every
rank holds the same weights after the all-reduce); a server never has two publishers.

Faults: a server that cannot be reached at start is a set-up error naming its URL. A server that
dies mid-step has its unanswered requests rerun on the others, exactly (the fleet's docstring);
it rejoins at the next publish if it answers again by then. When every server is gone,
``restart_wait_s`` > 0 waits for one to be restarted, loads the latest publish into it again and
reruns the lost requests there (exact too: the same weights under the same version). A publish that fails
half-way leaves the servers labelled ``partial-<version>`` and this engine refusing to generate until a
complete publish succeeds. No wait is unbounded (``request_timeout_s``, ``event_timeout_s``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from ...core.errors import EngineError
from ...core.protocols import TaskSource
from ...core.types import ModelSpec, RolloutEvent, RolloutRequest
from ..agent.env_pool import EnvPool
from ..agent.issue_order import IssueOrder
from ..agent.loop import AgentLoop, Generation, GenerationRequest
from .model import check_weights, materialize_model
from .server_client import ServerClient
from .server_fleet import ServerFleet
from .server_publish import FleetPublish, learner_address

if TYPE_CHECKING:
    from .server_config import VLLMServerEngineConfig

__all__ = ["VLLMServerEngine"]

log = logging.getLogger(__name__)


class VLLMServerEngine:
    """Rollout engine over vLLM servers; see the module docstring. Build with
    ``VLLMServerEngineConfig.build``.

    Public state: ``version`` (-1 until the first publish), ``last_publish_seconds``,
    ``publish_count``, ``max_model_len`` (the config's, else the smallest of the servers'), ``urls``
    (this rank's live servers),
    ``failovers`` (requests rerun on another server), ``answered`` (requests per server),
    ``restart_count`` (steps saved by a restarted server, ``restart_wait_s``).
    """

    def __init__(self, config: VLLMServerEngineConfig, model_spec: ModelSpec, tasks: TaskSource) -> None:
        self.config = config
        clients = [
            ServerClient(u, config.request_timeout_s, config.connect_timeout_s)
            for u in _rank_urls(config.urls)
        ]
        infos = [c.info() for c in clients]  # an unreachable or misconfigured server fails here, named
        dtypes = {c.url: i.dtype for c, i in zip(clients, infos) if i.dtype != model_spec.dtype}
        if dtypes:
            raise EngineError(
                f"the vLLM servers {dtypes} generate in another dtype than the learner's {model_spec.dtype}: "
                f"start them with --dtype {model_spec.dtype} (logprobs must be the learner's own)"
            )
        workdir = tempfile.mkdtemp(prefix="thundersync-vllm-server-")
        try:  # the architecture's names and shapes, to check every publish before it starts
            self._layout = materialize_model(model_spec, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        short = {
            c.url: i.max_model_len
            for c, i in zip(clients, infos)
            if i.max_model_len < (config.max_model_len or 0)
        }
        if short:
            raise EngineError(
                f"the vLLM servers {short} allow shorter contexts than max_model_len={config.max_model_len}: "
                "start them with a larger --max-model-len, or lower max_model_len"
            )
        self.max_model_len = config.max_model_len or min(i.max_model_len for i in infos)
        self._fleet = ServerFleet(
            clients, infos, config.temperature, config.max_inflight_per_server,
            recover=self._recover if config.restart_wait_s > 0 else None,
        )  # fmt: skip
        self._publisher = FleetPublish(
            config.weight_sync_bucket_bytes,
            config.transfer_timeout_s,
            config.learner_host or learner_address(clients[0].url),
        )
        self._pool = EnvPool(config.env_workers, name="vllm-server-env")
        self._agents = AgentLoop(
            tasks,
            self._generate,
            self._pool,
            step_timeout_s=config.step_timeout_s,
            verdict_timeout_s=config.verdict_timeout_s,
            max_batch_size=config.max_batch_size,
            max_context_tokens=self.max_model_len,
        )
        self._version = -1
        self._broken: str | None = None
        self._closed = False
        self._order = IssueOrder(
            self._agents.run,
            config.event_limit_s(int(getattr(tasks, "max_turns", 1))),
            "VLLMServerEngineConfig",
            "vllm-server-rollout",
        )
        self.last_publish_seconds: float | None = None
        self.publish_count = 0
        self.restart_count = 0  # times a restarted server took over a step's lost requests
        self._snapshot: dict[str, Tensor] | None = None  # the latest publish, for a restarted server
        self._recovering = threading.Lock()

    # -- RolloutEngine ------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def urls(self) -> list[str]:
        return [c.url for c in self._fleet.live]

    @property
    def failovers(self) -> int:
        """Generation requests rerun on another server after theirs stopped answering."""
        return self._fleet.failovers

    @property
    def answered(self) -> dict[str, int]:
        """Generation requests each server (URL) has answered."""
        return dict(self._fleet.answered)

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None:
        """Load ``weights`` (HF names) into every live server for every request issued after this call."""
        if self._closed:
            raise EngineError("publish on a shut-down VLLMServerEngine; build a new engine")
        if version < self._version:
            raise EngineError(
                f"publish of version {version} after version {self._version}: versions must not go back"
            )
        check_weights(self._layout, weights)
        with self._order.lock:
            self._order.wait_idle(version)
            start = time.monotonic()
            self._broken = f"the publish of version {version} has not completed"
            revived = self._fleet.revive()
            for client in revived:
                log.warning(
                    "the vLLM server at %s answers again: it rejoins with version %d", client.url, version
                )
            if revived:  # a restarted server's workers are not in the current transfer group
                self._publisher.close()
            servers = [(c, self._fleet.info(c).workers) for c in self._fleet.require_live()]
            try:
                self._publisher.publish(servers, weights, version)
            except BaseException as exc:
                for client, _ in servers:
                    if not client.alive():
                        self._fleet.drop(client, f"it died during the publish of version {version}")
                self._broken = (
                    f"the publish of version {version} failed half-way ({type(exc).__name__}: {exc}); the "
                    "servers are labelled partial and their answers are refused"
                )
                raise EngineError(
                    f"{self._broken}. Publish a complete state_dict again before the next rollout."
                ) from exc
            if self.config.restart_wait_s > 0:  # a copy: the learner steps its parameters in place
                self._snapshot = {name: t.detach().to("cpu", copy=True) for name, t in weights.items()}
            self._version = version
            self._broken = None
            self.publish_count += 1
            self.last_publish_seconds = time.monotonic() - start

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        """Start generating ``request`` now; the iterator yields its events in completion order."""
        return self._order.rollout(request, self._issue_version)

    def prepare(self, request: RolloutRequest) -> None:
        """Start ``request``'s environments now (no weights, no generation); see :meth:`AgentLoop.prepare`."""
        if self._closed:
            raise EngineError("prepare on a shut-down VLLMServerEngine; build a new engine")
        self._agents.prepare(request)

    def shutdown(self) -> None:
        """Stop using the servers (they keep running: they are not this process's), close prepared
        environments nobody rolled out. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._publisher.close()
        self._fleet.close()
        self._agents.close_prepared()
        self._pool.shutdown()

    def __enter__(self) -> VLLMServerEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- pieces ---------------------------------------------------------------------------------

    def _recover(self, reasons: str) -> None:
        """Every server is gone mid-step: wait up to ``restart_wait_s`` for one to answer again, load
        it with the latest publish (labelled with its version) and return; the lost requests rerun
        on it, exactly (the fleet's docstring). One recovery at a time: a caller that waited for
        another's finds a live server and returns."""
        with self._recovering:
            if self._fleet.live:
                return
            wait_s = self.config.restart_wait_s
            log.warning(
                "every vLLM server is gone (%s); waiting up to %g s for one to be restarted", reasons, wait_s
            )
            deadline = time.monotonic() + wait_s
            while not self._fleet.revive():
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"every vLLM server is gone ({reasons}) and none answered again within "
                        f"restart_wait_s={wait_s:g} s. Restart them, or raise restart_wait_s."
                    )
                time.sleep(1.0)  # another machine's supervisor restarts the server: nothing to wait on here
            assert self._snapshot is not None, "a step generates only after a publish"
            self._publisher.close()  # the restarted server's workers are not in the current transfer group
            servers = [(c, self._fleet.info(c).workers) for c in self._fleet.require_live()]
            self._publisher.publish(servers, self._snapshot, self._version)
            self.restart_count += 1

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        # publish waits for every request in flight, so the current version is the one they were issued at
        return self._fleet.generate(requests, self._version)

    def _issue_version(self) -> int:
        """The version a rollout issued now generates with; raises if the engine cannot generate."""
        if self._closed:
            raise EngineError("rollout on a shut-down VLLMServerEngine; build a new engine")
        if self._broken is not None:
            raise EngineError(f"refusing to generate: {self._broken}. Publish a complete state_dict first.")
        if self._version < 0:
            raise EngineError(
                "refusing to generate: no weights published yet (the servers hold their own checkpoint, "
                "not the learner's). Call engine.publish(model.state_dict(), version=0) first."
            )
        return self._version


def _rank_urls(urls: Sequence[str]) -> list[str]:
    """This learner rank's servers: rank r of N uses ``urls[r::N]``, so each server has one publisher
    (every rank holds the same weights after the all-reduce, so each loads its own servers)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(urls)
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(urls) < world:
        raise EngineError(
            f"{world} learner ranks share {len(urls)} vLLM servers: each server serves one rank (its weights "
            f"are that rank's to publish). Start at least {world} servers or run fewer ranks."
        )
    return list(urls[rank::world])
