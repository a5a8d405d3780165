"""Text <-> token ids for code environments: a byte-level codec by default, any HF tokenizer optionally.

:class:`ByteCodec`: ids 0..255 are UTF-8 bytes; above them a few special ids. The end-of-action id
is the stop token the engine samples until. Decoding drops special ids and replaces invalid UTF-8.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["TextCodec", "ByteCodec", "HFTokenizerCodec"]


@runtime_checkable
class TextCodec(Protocol):
    vocab_size: int
    end_of_action: int

    def encode(self, text: str) -> tuple[int, ...]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteCodec:
    """UTF-8 bytes as ids 0..255; ``END_OF_ACTION`` (256) ends an action, ``OBSERVATION`` (257)
    opens an environment observation, ``PAD`` (258) is free for engines. ``vocab_size`` is 259."""

    END_OF_ACTION = 256
    OBSERVATION = 257
    PAD = 258
    vocab_size = 259
    end_of_action = END_OF_ACTION

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def __eq__(self, other: object) -> bool:
        return type(other) is ByteCodec

    def __hash__(self) -> int:
        return hash(ByteCodec)


class HFTokenizerCodec:
    """A Hugging Face tokenizer loaded from a local directory (loaded lazily; picklable by path).
    ``end_of_action`` is the tokenizer's EOS id unless given."""

    def __init__(self, path: str, end_of_action: int | None = None) -> None:
        self.path = path
        self._eoa = end_of_action
        self._tok: Any = None

    def _tokenizer(self) -> Any:
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.path)
        return self._tok

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer())

    @property
    def end_of_action(self) -> int:
        return self._eoa if self._eoa is not None else int(self._tokenizer().eos_token_id)

    def _special_ids(self) -> frozenset[int]:
        tok = self._tokenizer()
        ids = set(tok.all_special_ids)
        ids.update(i for i, t in getattr(tok, "added_tokens_decoder", {}).items() if getattr(t, "special", False))
        return frozenset(int(i) for i in ids)

    def encode(self, text: str) -> tuple[int, ...]:
        """Environment text as ordinary tokens: special-token strings in it never become special ids."""
        tok = self._tokenizer()
        ids = tuple(tok.encode(text, add_special_tokens=False, split_special_tokens=True))
        special = self._special_ids()
        if not special.intersection(ids):
            return ids
        # A tokenizer that ignores split_special_tokens: encode the special strings char by char.
        out: list[int] = []
        contents = sorted({tok.convert_ids_to_tokens(i) for i in special}, key=len, reverse=True)
        pos = 0
        while pos < len(text):
            hit = next((c for c in contents if c and text.startswith(c, pos)), None)
            if hit is None:
                nxt = min((j for j in (text.find(c, pos) for c in contents if c) if j >= 0), default=len(text))
                out.extend(tok.encode(text[pos:nxt], add_special_tokens=False))
                pos = nxt
            else:
                for ch in hit:
                    out.extend(tok.encode(ch, add_special_tokens=False))
                pos += len(hit)
        return tuple(i for i in out if i not in special)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer().decode(list(ids), skip_special_tokens=True))

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_eoa": self._eoa, "_tok": None}
