"""One renderer of multi-turn agent conversations, through a tokenizer's chat template.

Environments (the engine side) build a trajectory incrementally: the prompt, then after each
generated assistant turn the tokens that close it and open the next turn (an observation as a
user message, then the generation prompt). The learner never re-tokenizes: it scores the exact
ids the engine produced. Both sides get their ids from this class, so the conversation is
rendered identically: :meth:`ChatRenderer.render` of the whole conversation equals the prompt +
actions + :meth:`ChatRenderer.observation_ids` pieces, which :meth:`ChatRenderer.check_prefix_stable`
verifies for a template (templates that rewrite earlier turns, e.g. strip past reasoning, are
rejected with a ConfigError instead of training on ids no inference server would produce).

The tokenizer is loaded lazily from a local directory (``transformers.AutoTokenizer``, offline);
the renderer pickles by path, so it travels to the engine's process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import ConfigError

__all__ = ["ChatRenderer", "Message"]

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}

_PROBE = ({"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"})


class ChatRenderer:
    """``apply_chat_template`` of the tokenizer in ``tokenizer_path`` (or ``chat_template``, a Jinja
    string that replaces the tokenizer's). Raises ConfigError when there is no template."""

    def __init__(self, tokenizer_path: str, chat_template: str | None = None) -> None:
        self.tokenizer_path = tokenizer_path
        self.chat_template = chat_template
        self._tok: Any = None
        self.check_prefix_stable()

    def __getstate__(self) -> dict[str, Any]:
        return {"tokenizer_path": self.tokenizer_path, "chat_template": self.chat_template, "_tok": None}

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            from transformers import AutoTokenizer

            try:
                tok = AutoTokenizer.from_pretrained(self.tokenizer_path, local_files_only=True)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"ChatRenderer: no tokenizer in {self.tokenizer_path!r} ({exc})") from exc
            if self.chat_template is not None:
                tok.chat_template = self.chat_template
            if not getattr(tok, "chat_template", None):
                raise ConfigError(
                    f"the tokenizer in {self.tokenizer_path!r} has no chat template; pass chat_template= (a Jinja "
                    "string), use a chat/instruct model's tokenizer, or render prompts without a template"
                )
            self._tok = tok
        return self._tok

    @property
    def end_of_turn(self) -> int:
        """The stop token of an assistant turn (the tokenizer's EOS id)."""
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ConfigError(f"the tokenizer in {self.tokenizer_path!r} has no eos_token: set one to end turns")
        return int(eos)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> tuple[int, ...]:
        """The token ids of ``messages`` (plus the assistant generation prompt when asked)."""
        ids = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=True, add_generation_prompt=add_generation_prompt,
            return_dict=False,
        )
        if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding regardless
            ids = ids["input_ids"]
        return tuple(int(i) for i in ids)

    def prompt_ids(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """The first turn: ``messages`` and the generation prompt."""
        return self.render(messages, add_generation_prompt=True)

    def observation_ids(self, history: Sequence[Message], observation: str) -> tuple[int, ...]:
        """What follows an assistant turn's end-of-turn token: ``history`` ends with that turn; the
        observation becomes a user message, then the generation prompt. The difference of two renders."""
        before = self.render(history, add_generation_prompt=False)
        after = self.render([*history, {"role": "user", "content": observation}], add_generation_prompt=True)
        if after[: len(before)] != before:
            raise ConfigError("the chat template renders earlier turns differently once a turn is added (not "
                              "prefix-stable); multi-turn trajectories cannot be rendered incrementally with it")
        return after[self._after_last_end_of_turn(before):]

    def assistant_ids(self, history: Sequence[Message], content: str) -> tuple[int, ...]:
        """An assistant turn as the template renders it, through its end-of-turn token (what the
        engine generates when the policy writes ``content`` and stops)."""
        before = self.render(history, add_generation_prompt=True)
        after = self.render([*history, {"role": "assistant", "content": content}], add_generation_prompt=False)
        return after[len(before): self._after_last_end_of_turn(after)]

    def _after_last_end_of_turn(self, ids: Sequence[int]) -> int:
        eot = self.end_of_turn
        positions = [i for i, t in enumerate(ids) if t == eot]
        if not positions:
            raise ConfigError("the chat template does not end an assistant turn with the tokenizer's eos_token")
        return positions[-1] + 1

    def check_prefix_stable(self) -> None:
        """Raise ConfigError for a missing template or one that rewrites earlier turns."""
        history = [_PROBE[0]]
        prompt = self.prompt_ids(history)
        reply = self.assistant_ids(history, _PROBE[1]["content"])
        obs = self.observation_ids([*history, _PROBE[1]], "ok")
        whole = self.render([*history, _PROBE[1], {"role": "user", "content": "ok"}], add_generation_prompt=True)
        if prompt + reply + obs != whole:
            raise ConfigError("the chat template is not prefix-stable: prompt + assistant turn + observation "
                              "rendered one by one differ from the whole conversation rendered at once")

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids, special tokens (the end of turn) dropped."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(int(i) for i in self.tokenizer.encode(text, add_special_tokens=False))
