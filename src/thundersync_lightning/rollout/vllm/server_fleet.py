"""The vLLM servers of one :class:`~.server_engine.VLLMServerEngine`: which are live, and one
generation call spread over them with the version of every response checked.

Spreading: each request of a call goes to the live server with the fewest requests outstanding;
each server has at most ``max_inflight_per_server`` of them in flight (the rest queue here), so
vLLM batches what a server holds (continuous batching) and no server is flooded.

Version check (zero staleness across the network): vLLM labels every span of sampled tokens with
the weight version its engine core held when it sampled them (``weight_versions``); the engine
sets the label at the end of every complete publish (:mod:`.server_publish`). A response
whose tokens are not all labelled with the version the call expects is refused with
:class:`StaleResponse`: it was sampled with other weights (a publish half-way, another client's
update, a restarted server's own checkpoint), so its logprobs are not the policy's.

Failover, exact: a server that stops answering (:class:`~.server_client.ServerGone`) is
dropped from the live set and the requests it had not answered run again on the others. A
request is one turn (prefix, seed), every live server holds the same weights under the same label,
and vLLM's seeded sampling does not depend on the batch, so the rerun gives the lost tokens
exactly (the rule :mod:`.core` applies to a restarted local engine core). With no server
left the call raises :class:`EngineError` naming every URL; a dropped server that answers again
rejoins at the next publish (:meth:`ServerFleet.revive`), which gives it the weights first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from ...core.errors import EngineError
from ..agent.loop import Generation, GenerationRequest
from .server_client import ServerClient, ServerGone, ServerInfo

__all__ = ["ServerFleet", "StaleResponse"]

log = logging.getLogger(__name__)


class StaleResponse(EngineError):
    """A server answered with tokens sampled by weights of another version than the call's."""


class _Server:
    def __init__(self, client: ServerClient, info: ServerInfo, inflight: int) -> None:
        self.client = client
        self.info = info
        self.outstanding = 0  # requests handed to this server and not yet answered (under the fleet lock)
        self.gone: str | None = None  # why it was dropped
        self.incarnation = 0  # times it was taken back: a late failure of an earlier one must not drop it
        self.pool = ThreadPoolExecutor(max_workers=inflight, thread_name_prefix=f"vllm-server-{client.url}")


class ServerFleet:
    """Live servers and the generation call over them; see the module docstring.

    Args:
        clients: one per server URL, in the config's order.
        infos: each server's checked configuration (:meth:`ServerClient.info`).
        temperature: the sampling temperature of every request.
        max_inflight_per_server: requests one server holds at a time.
        recover: called (with why every server is gone) when no server is left in a generation
            call; it returns once a server is live again with the call's weights, or raises.
    """

    def __init__(
        self,
        clients: Sequence[ServerClient],
        infos: Sequence[ServerInfo],
        temperature: float,
        max_inflight_per_server: int,
        recover: Callable[[str], None] | None = None,
    ) -> None:
        self._recover = recover
        self._servers = [_Server(c, i, max_inflight_per_server) for c, i in zip(clients, infos)]
        self._temperature = temperature
        self._lock = threading.Lock()
        self.failovers = 0  # requests rerun on another server after theirs stopped answering
        self.answered = {c.url: 0 for c in clients}  # generation requests each server has answered

    @property
    def live(self) -> list[ServerClient]:
        """The servers in use, in the config's order."""
        with self._lock:
            return [s.client for s in self._servers if s.gone is None]

    def info(self, client: ServerClient) -> ServerInfo:
        return next(s.info for s in self._servers if s.client is client)

    def drop(self, client: ServerClient, why: str, incarnation: int | None = None) -> None:
        """Stop using ``client``'s server (it stopped answering); idempotent. ``incarnation``: only if
        the server is still the one a failed request went to (not a restarted one taken back since)."""
        with self._lock:
            server = next(s for s in self._servers if s.client is client)
            if server.gone is None and incarnation in (None, server.incarnation):
                server.gone = why
                log.warning("dropping the vLLM server at %s: %s", client.url, why)

    def revive(self) -> list[ServerClient]:
        """Take back dropped servers that answer again (call only while nothing generates: they hold
        other weights until the publish that follows); returns those taken back."""
        back = []
        for server in self._servers:
            if server.gone is not None and server.client.alive():
                try:
                    server.info = server.client.info()
                except EngineError:
                    continue
                with self._lock:
                    server.gone = None
                    server.incarnation += 1
                back.append(server.client)
        return back

    def generate(self, requests: Sequence[GenerationRequest], version: int) -> list[Generation]:
        """Every request's generation, in order, each sampled with weights labelled ``version``."""
        label = str(version)
        results: list[Generation | None] = [None] * len(requests)
        running: dict[Future[tuple[Generation, list[str]]], tuple[int, _Server, int]] = {}
        waiting = list(range(len(requests)))
        try:
            while waiting or running:
                for index in waiting:
                    server = self._pick()
                    future = server.pool.submit(server.client.generate, requests[index], self._temperature)
                    running[future] = (index, server, server.incarnation)
                waiting = []
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    index, server, incarnation = running.pop(future)
                    with self._lock:
                        server.outstanding -= 1
                    try:
                        generation, labels = future.result()
                    except ServerGone as exc:
                        self.drop(server.client, str(exc), incarnation)
                        with self._lock:
                            self.failovers += 1
                        waiting.append(index)
                        continue
                    if generation.tokens and labels != [label]:
                        raise StaleResponse(
                            f"the vLLM server at {server.client.url} answered with tokens sampled by weights "
                            f"labelled {labels}, but this request was issued at weight version {label}: "
                            "refused (its logprobs are not the policy's, staleness would not be 0). Only "
                            "this learner may update the servers' weights."
                        )
                    results[index] = generation
                    with self._lock:
                        self.answered[server.client.url] += 1
        finally:
            for future, (_, server, _) in running.items():  # a raise leaves these to finish on their own
                future.add_done_callback(lambda _f, s=server: self._settle(s))
        return [r for r in results if r is not None]

    def close(self) -> None:
        for server in self._servers:
            server.pool.shutdown(wait=False, cancel_futures=True)
            server.client.close()

    def require_live(self) -> list[ServerClient]:
        """The live servers;
        raises :class:`EngineError` naming every server and why it was dropped if none is."""
        with self._lock:
            return [s.client for s in self._live()]

    def _live(self) -> list[_Server]:
        live = [s for s in self._servers if s.gone is None]
        if not live:
            raise EngineError(
                f"every vLLM server is gone ({self._reasons()}). Restart them; the next publish takes back "
                "those that answer."
            )
        return live

    def _reasons(self) -> str:
        return "; ".join(f"{s.client.url}: {s.gone}" for s in self._servers)

    def _pick(self) -> _Server:
        with self._lock:
            gone = all(s.gone is not None for s in self._servers)
        if gone and self._recover is not None:
            self._recover(self._reasons())
        with self._lock:
            server = min(self._live(), key=lambda s: s.outstanding)
            server.outstanding += 1
            return server

    def _settle(self, server: _Server) -> None:
        with self._lock:
            server.outstanding -= 1
