"""The token-level code environment: prompt, bash/edit/submit actions, bounded observations, tests.

Actions come in one of two formats: ``text`` (the action language of :mod:`.actions`, any codec)
or ``tools`` (native tool calls through the model's chat template: a
:class:`~..tools.ToolConversation` over the tools of :mod:`.tools`). Works over any
:class:`Workspace` (a local task in bubblewrap, a SWE-bench instance in a container). ``verdict`` extracts the
agent's diff, drops changes to protected (test) files, and
grades the rest on a fresh copy of the original repository; an empty patch is reward 0.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Literal, Protocol

from ...core.errors import HostFault
from ...core.types import StepResult
from ..codec import ByteCodec, TextCodec
from ..sandbox.base import SandboxResult
from ..tools import ToolConversation, clip_text
from .actions import ACTION_HELP, Bash, Invalid, Submit, edit_command, parse_action
from .grading import EvalOutcome

__all__ = [
    "Workspace",
    "CodeEnv",
    "format_observation",
    "clip_bytes",
    "OBSERVATION_FRAME_BYTES",
    "render_prompt",
    "ActionFormat",
    "TOOLS_HELP",
]

ActionFormat = Literal["text", "tools"]

TOOLS_HELP = (
    "Use the tools to inspect and edit the repository; call one tool per step and read its result. "
    "Call submit when you are done: the hidden tests then decide your reward."
)


class Workspace(Protocol):
    def open(self) -> None: ...

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None
    ) -> SandboxResult: ...

    def diff(self) -> str | None: ...

    def evaluate(self, patch: str) -> EvalOutcome: ...

    def close(self) -> None: ...


def render_prompt(
    problem_statement: str, files: Sequence[str] = (), action_format: ActionFormat = "text"
) -> str:
    if action_format == "tools":
        return f"{_problem(problem_statement, files)}{TOOLS_HELP}\n"
    return (
        f"{_problem(problem_statement, files)}{ACTION_HELP}\n"
        "Each action ends with the end-of-action token; you then see the result.\n\n"
    )


def _problem(problem_statement: str, files: Sequence[str]) -> str:
    listing = "".join(f"  {f}\n" for f in files[:200])
    more = f"  ... and {len(files) - 200} more\n" if len(files) > 200 else ""
    repo = f"Repository files:\n{listing}{more}\n" if files else ""
    return (
        "You are fixing a bug in the Python repository in your working directory.\n\n"
        f"Problem:\n{problem_statement.strip()}\n\n{repo}"
    )


OBSERVATION_FRAME_BYTES = len("\n<observation>\n\n</observation>\n")
#: The default bound on one turn's observation (characters), for the episode and its tools alike.
MAX_OBSERVATION_BYTES = 2048


def clip_bytes(text: str, max_bytes: int) -> str:
    """At most ``max_bytes`` UTF-8 bytes of ``text``: its head and tail around a cut note (the note
    counts; characters split by a cut are dropped)."""
    data = text.encode("utf-8", "replace")  # a lone surrogate becomes "?": the codec can encode the result
    if len(data) <= max_bytes:
        return data.decode("utf-8")
    note = f"\n[... {len(data) - max_bytes} bytes cut ...]\n".encode()
    room = max(0, max_bytes - len(note))
    head = room * 2 // 3
    kept = data[:head] + note + data[len(data) - (room - head) :] if room > head else data[:head] + note
    return kept[:max_bytes].decode("utf-8", "ignore")


def format_observation(result: SandboxResult, max_bytes: int) -> str:
    """Exit status and the head and tail of the output, at most ``max_bytes`` bytes of it."""
    out = result.output
    if len(out) > max_bytes:
        head = max_bytes * 2 // 3
        out = (
            out[:head]
            + f"\n[... {len(out) - max_bytes} bytes cut ...]\n".encode()
            + out[-(max_bytes - head) :]
        )
    status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    if result.truncated and not result.timed_out:
        status = "output limit reached, command stopped"
    return f"[{status}]\n{out.decode('utf-8', errors='replace')}"


class CodeEnv:
    """One episode on one task. ``reset`` opens the workspace; ``close`` frees it (idempotent).

    With ``conversation`` (native tool calls) the prompt is rendered by its chat template and each
    action's tool calls run in the workspace; ``codec`` is then unused."""

    def __init__(
        self,
        workspace: Workspace,
        prompt: str,
        codec: TextCodec | None = None,
        max_observation_bytes: int = MAX_OBSERVATION_BYTES,
        python: str = "python3",
        conversation: ToolConversation | None = None,
    ) -> None:
        self.workspace = workspace
        self.conversation = conversation
        self.prompt = prompt
        self.codec = codec if codec is not None else ByteCodec()
        self.max_observation_bytes = max_observation_bytes
        self.python = python
        self.done = False
        self.turns = 0
        self.last_outcome: EvalOutcome | None = None
        self._opened = self._closed = False
        self._lock = threading.Lock()

    def reset(self) -> tuple[int, ...]:
        if self._closed:
            raise RuntimeError("CodeEnv.reset after close()")
        if not self._opened:
            self.workspace.open()
            self._opened = True
        self.done = False
        self.turns = 0
        if self.conversation is not None:
            return self.conversation.start([{"role": "user", "content": self.prompt}])
        return self.codec.encode(self.prompt)

    def _observe(self, text: str) -> tuple[int, ...]:
        """The framed observation: its text at most ``max_observation_bytes`` UTF-8 bytes (head and
        tail), plus the frame (:data:`OBSERVATION_FRAME_BYTES`); at most as many ids as bytes."""
        ids = self.codec.encode(
            f"\n<observation>\n{clip_bytes(text.rstrip(), self.max_observation_bytes)}\n</observation>\n"
        )
        # one id per byte at most (ByteCodec, byte-level BPE): the cut binds only for a tokenizer that
        # spends more (a prefix-space token), so max_episode_tokens() holds with any codec
        return ids[: self.max_observation_bytes + OBSERVATION_FRAME_BYTES]

    def act_text(self, text: str) -> tuple[str | None, bool, bool]:
        """Perform one action given as text: (observation text or None, done, invalid).

        Never raises for what the model wrote: an action that cannot be parsed or run (a command
        the sandbox refuses: a NUL byte, a lone surrogate) is an invalid action with the reason;
        only a :class:`~...core.errors.HostFault` leaves."""
        try:
            action = parse_action(text)
            if isinstance(action, Submit):
                return None, True, False
            if isinstance(action, Invalid):
                return self._invalid(action.reason), False, True
            if isinstance(action, Bash):
                result = self.workspace.run(action.command)
            else:
                command, stdin = edit_command(action, self.python)
                result = self.workspace.run(command, stdin=stdin)
        except HostFault:
            raise
        except Exception as exc:  # noqa: BLE001 - model output never raises on the host
            return self._invalid(f"{type(exc).__name__}: {str(exc)[:200]}"), False, True
        return format_observation(result, self.max_observation_bytes), False, False

    def _invalid(self, reason: str) -> str:
        return clip_text(f"[invalid action] {reason}\n\n{ACTION_HELP}", self.max_observation_bytes)

    def step(self, action: Sequence[int]) -> StepResult:
        if not self._opened or self._closed:
            raise RuntimeError("CodeEnv.step before reset() or after close()")
        if self.done:
            return StepResult((), True)
        if self.conversation is not None:
            self.turns += 1
            turn = self.conversation.respond(action, self.workspace)
            self.done = turn.done
            return StepResult(turn.observation, turn.done, turn.calls, turn.invalid)
        ids = list(action)
        eoa = self.codec.end_of_action
        if eoa in ids:
            ids = ids[: ids.index(eoa)]
        self.turns += 1
        try:
            decoded = self.codec.decode(ids)
        except Exception as exc:  # noqa: BLE001 - ids no tokenizer can decode: an invalid action
            text, done, invalid = (
                self._invalid(f"the action cannot be decoded ({type(exc).__name__})"),
                False,
                True,
            )
        else:
            text, done, invalid = self.act_text(decoded)
        self.done = done
        # a text action counts as one call (rollout/invalid_tool_call_fraction: invalid actions)
        return StepResult(self._observe(text) if text is not None else (), done, 1, int(invalid))

    def outcome(self) -> EvalOutcome:
        """Grade the current state of the repository (the verdict with its reasons)."""
        with self._lock:
            if self.last_outcome is None:
                if not self._opened or self._closed:
                    self.last_outcome = EvalOutcome(False, "the episode never started or was closed")
                else:
                    patch = self.workspace.diff()
                    if patch is None:
                        self.last_outcome = EvalOutcome(False, "could not read the agent's changes")
                    else:
                        self.last_outcome = self.workspace.evaluate(patch)
            return self.last_outcome

    def verdict(self) -> float:
        return self.outcome().reward

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.workspace.close()
