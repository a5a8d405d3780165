"""Text <-> token ids for environments that speak text: a byte-level codec by
default, any HF tokenizer optionally.

:class:`ByteCodec`: ids 0..255 are UTF-8 bytes; above them a few special ids. The end-of-action id
is the stop token the engine samples until. Decoding drops special ids and replaces invalid UTF-8.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from .tokens import encode_plain, load_tokenizer

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
            self._tok = load_tokenizer(self.path)
        return self._tok

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer())

    @property
    def end_of_action(self) -> int:
        return self._eoa if self._eoa is not None else int(self._tokenizer().eos_token_id)

    def encode(self, text: str) -> tuple[int, ...]:
        """Environment text as ordinary tokens: no added token of the tokenizer (special or not) can be
        forged by it (:func:`~thundersync_lightning.envs.tokens.encode_plain`)."""
        return encode_plain(self._tokenizer(), text)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer().decode(list(ids), skip_special_tokens=True))

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_eoa": self._eoa, "_tok": None}
