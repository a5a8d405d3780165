"""One renderer of multi-turn agent conversations, through a tokenizer's chat template.

Token-exact episodes. The engine samples an assistant turn through its end-of-turn token; the
environment then appends the template's rendering of the new messages (observations, tool
results) and the generation prompt *as tokens after the sampled ids*. Earlier model output is
never re-tokenized, so the learner scores exactly the ids the engine sampled, and the episode's
context is what the model was shown:

    context_k = prompt ++ a_1 ++ s_1 ++ a_2 ++ ... ++ a_k ++ s_k
    s_k = the template's text of (history ++ new_k, generation prompt) after the end-of-turn
          token that closes the history's last assistant turn

(``a_i``: sampled ids, ``s_i``: :meth:`ChatRenderer.suffix_ids`). A template that rewrites
earlier turns when a message is added (Qwen3 drops the reasoning of assistant turns before the
last user message) is supported: the rewrite would only touch text before the cut, and the
history stays the appended tokens, so the model keeps seeing its own earlier turns as sampled.
For a prefix-stable template, ``context_k`` equals :meth:`ChatRenderer.render` of the whole
conversation.

Untrusted text. Message contents that are not the model's own (system, user, tool) are cut out
of the rendering with sentinels and encoded by :func:`~.tokens.encode_plain`: no added token
(``<|im_end|>``, ``<tool_call>``, ``<think>``) can be forged by a tool result or a prompt; the
template's own markup is tokenized normally. Contents the template does not copy verbatim exactly
once are a ConfigError (the rendering could not be split safely).

Template options (``enable_thinking=False`` for Qwen3, ...) go in ``template_kwargs``; tools are
passed to ``apply_chat_template(tools=...)`` as JSON schemas. The tokenizer is loaded lazily from
a local directory (``transformers.AutoTokenizer``, offline); the renderer pickles by path, so it
travels to the engine's process.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import ConfigError
from .tokens import added_token_ids, encode_plain, load_tokenizer

__all__ = ["ChatRenderer", "Message"]

Message = Mapping[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}

_SENTINEL = "\ue000tsl{}\ue001"
_SENTINEL_RE = re.compile("\ue000tsl(\\d+)\ue001")
_OWN = "assistant"  # the role whose contents are the model's own text


class ChatRenderer:
    """``apply_chat_template`` of the tokenizer in ``tokenizer_path`` (or ``chat_template``, a Jinja
    string that replaces the tokenizer's), token-exact and injection-safe (see the module docstring).

    Args:
        tokenizer_path: a local directory with the tokenizer (and usually the model).
        chat_template: a Jinja string that replaces the tokenizer's template.
        template_kwargs: extra variables for the template, e.g. ``{"enable_thinking": False}``.

    Raises ConfigError when there is no template or it does not end assistant turns with the EOS token.
    """

    def __init__(
        self,
        tokenizer_path: str,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer_path = tokenizer_path
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self._tok: Any = None
        self._added: frozenset[int] | None = None
        self.check_template()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "tokenizer_path": self.tokenizer_path,
            "chat_template": self.chat_template,
            "template_kwargs": self.template_kwargs,
            "_tok": None,
            "_added": None,
        }

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            tok = load_tokenizer(self.tokenizer_path)
            if self.chat_template is not None:
                tok.chat_template = self.chat_template
            if not getattr(tok, "chat_template", None):
                raise ConfigError(
                    f"the tokenizer in {self.tokenizer_path!r} has no chat template; pass chat_template= (a "
                    "Jinja string), use a chat/instruct model's tokenizer, or "
                    "render prompts without a template"
                )
            self._tok = tok
        return self._tok

    @property
    def added_ids(self) -> frozenset[int]:
        """Every added token id of the tokenizer (special or not): never produced from untrusted text."""
        if self._added is None:
            self._added = added_token_ids(self.tokenizer)
        return self._added

    @property
    def end_of_turn(self) -> int:
        """The stop token of an assistant turn (the tokenizer's EOS id)."""
        eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ConfigError(
                f"the tokenizer in {self.tokenizer_path!r} has no eos_token: set one to end turns"
            )
        return int(eos)

    @property
    def _end_of_turn_text(self) -> str:
        return str(self.tokenizer.convert_ids_to_tokens(self.end_of_turn))

    # -- rendering ------------------------------------------------------------------------------

    def render_text(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The template's text of ``messages`` (with ``tools`` and ``template_kwargs``)."""
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )
        return str(text)

    def _masked(self, messages: Sequence[Message], own_too: bool) -> tuple[list[dict[str, Any]], list[str]]:
        """Messages whose untrusted contents (and the model's too when ``own_too``) are sentinels."""
        out, contents = [], []
        for m in messages:
            m = dict(m)
            if isinstance(m.get("content"), str) and (own_too or m.get("role") != _OWN):
                contents.append(m["content"])
                m["content"] = _SENTINEL.format(len(contents) - 1)
            out.append(m)
        return out, contents

    def _encode(self, text: str, contents: Sequence[str], first: int = 0) -> tuple[int, ...]:
        """Markup through the tokenizer, sentinel ``i`` (i >= ``first``) as plain ``contents[i]``."""
        seen = [int(m.group(1)) for m in _SENTINEL_RE.finditer(text)]
        if sorted(seen) != list(range(first, len(contents))):
            raise ConfigError(
                "the chat template does not copy each message's content verbatim exactly once; its "
                "rendering cannot be split into template markup and untrusted text"
            )
        ids: list[int] = []
        pos = 0
        for m in _SENTINEL_RE.finditer(text):
            ids.extend(self.tokenizer.encode(text[pos : m.start()], add_special_tokens=False))
            ids.extend(encode_plain(self.tokenizer, contents[int(m.group(1))], self.added_ids))
            pos = m.end()
        ids.extend(self.tokenizer.encode(text[pos:], add_special_tokens=False))
        return tuple(int(i) for i in ids)

    def render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[int, ...]:
        """The token ids of a whole conversation (plus the generation prompt when asked).

        The model's own contents are tokenized as the template renders them; every other
        content is plain text (no added token)."""
        masked, contents = self._masked(messages, own_too=False)
        return self._encode(self.render_text(masked, add_generation_prompt, tools), contents)

    def prompt_ids(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> tuple[int, ...]:
        """The first turn: ``messages`` and the generation prompt."""
        return self.render(messages, add_generation_prompt=True, tools=tools)

    def suffix_ids(
        self,
        history: Sequence[Message],
        new: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[int, ...]:
        """What follows an assistant turn's end-of-turn token: ``history`` ends with that turn;
        ``new`` (tool results, a user message) as the template renders them there, then the
        generation prompt. Every content of ``history`` is a sentinel while rendering, so the cut
        depends on the conversation's structure only, never on what the model wrote."""
        if not history or history[-1].get("role") != _OWN:
            raise ValueError("suffix_ids: the history must end with an assistant turn")
        masked, contents = self._masked([*history, *new], own_too=True)
        before = self.render_text(masked[: len(history)], add_generation_prompt=False, tools=tools)
        after = self.render_text(masked, add_generation_prompt=True, tools=tools)
        eot = self._end_of_turn_text
        turns = before.count(eot)
        cut = -len(eot)
        for _ in range(turns):
            cut = after.find(eot, cut + len(eot))
            if cut < 0:
                break
        if turns == 0 or cut < 0:
            raise ConfigError(
                "the chat template does not end an assistant turn with the tokenizer's eos_token "
                f"({eot!r}); set eos_token to the template's end-of-turn token"
            )
        n_history = sum(1 for m in history if isinstance(m.get("content"), str))
        return self._encode(after[cut + len(eot) :], contents, first=n_history)

    def observation_ids(
        self, history: Sequence[Message], observation: str, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> tuple[int, ...]:
        """:meth:`suffix_ids` of one user message."""
        return self.suffix_ids(history, [{"role": "user", "content": observation}], tools)

    def assistant_ids(
        self, history: Sequence[Message], content: str, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> tuple[int, ...]:
        """An assistant turn as the template renders it, through its end-of-turn token (what the
        engine generates when the policy writes ``content`` and stops): scripted policies in tests."""
        before = self.render(history, add_generation_prompt=True, tools=tools)
        after = self.render(
            [*history, {"role": _OWN, "content": content}], add_generation_prompt=False, tools=tools
        )
        eot = self.end_of_turn
        ends = [i for i in range(len(before), len(after)) if after[i] == eot]
        if not ends:
            raise ConfigError(
                "the chat template does not end an assistant turn with the tokenizer's eos_token"
            )
        return after[len(before) : ends[0] + 1]

    def check_template(self) -> None:
        """Raise ConfigError for a missing template or one without the EOS token at the end of a turn."""
        history = [{"role": "user", "content": "ping"}, {"role": _OWN, "content": "pong"}]
        self.suffix_ids(history, [{"role": "user", "content": "ok"}])

    def decode(self, ids: Sequence[int]) -> str:
        """Text of generated ids, special tokens (the end of turn) dropped; added tokens that are
        not special (``<tool_call>``, ``<think>``) are kept: parsers read them."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def encode(self, text: str) -> tuple[int, ...]:
        """Untrusted text as plain tokens (no added token)."""
        return encode_plain(self.tokenizer, text, self.added_ids)
