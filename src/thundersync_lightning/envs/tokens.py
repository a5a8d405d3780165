"""Environment text as ordinary tokens: it can never become an added token of the tokenizer.

Tokenizers register *added tokens* beside their vocabulary: the special ones (``<|im_end|>``,
``<|endoftext|>``) and others that are not marked special (Qwen's ``<think>``, ``<tool_call>``,
``<tool_response>``). ``tokenizer.encode`` matches every added token's text before the model
sees the rest, so command output that prints ``</tool_response><tool_call>{...}`` would reach
the policy as the real control ids: a forged tool call or a forged end of turn.

Invariant of :func:`encode_plain`: for any text, no id of :func:`added_token_ids` appears in the
result. The set is read from the tokenizer (``added_tokens_decoder`` and ``all_special_ids``),
never from a list of names. With a fast tokenizer the text goes through the tokenizer's own
normalizer, pre-tokenizer and model, skipping only the added-token matching: text that contains
no added token encodes exactly as ``encode(text, add_special_tokens=False)`` does, and text that
does is spelled with ordinary vocabulary (``decode`` gives it back). A vocabulary that can only
spell a piece with an added id (a word-level vocabulary listing the control word itself) gets
that piece character by character, and a character that is itself an added token becomes the
encoding of U+FFFD.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.errors import ConfigError

__all__ = ["TOKENIZER_FILES", "added_token_ids", "encode_plain", "has_tokenizer", "load_tokenizer"]

#: A directory holding one of these holds a tokenizer (fast or slow).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

_REPLACEMENT = "\N{REPLACEMENT CHARACTER}"


def has_tokenizer(path: str) -> bool:
    """``path`` is a local directory with a tokenizer's files."""
    return os.path.isdir(path) and any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES)


def load_tokenizer(path: str, option: str = "tokenizer_path") -> Any:
    """The tokenizer in the local directory ``path``, never downloaded.

    A missing directory, or one without a tokenizer, is a :class:`ConfigError` naming ``option`` and
    the directory (transformers would report a failed download from the Hugging Face Hub instead).
    """
    from transformers import AutoTokenizer

    where = path if os.path.isabs(path) else f"{path} (from {os.getcwd()})"
    if not os.path.isdir(path):
        raise ConfigError(
            f"{option} {where!r} does not exist: give a local tokenizer directory (normally the model's own, "
            "written by save_pretrained or huggingface-cli download --local-dir); nothing is downloaded"
        )
    if not has_tokenizer(path):
        raise ConfigError(f"{option} {where!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{option} {where!r}: transformers cannot load its tokenizer ({first})") from exc


def added_token_ids(tokenizer: Any) -> frozenset[int]:
    """Every added token id of ``tokenizer``, special or not, plus its special ids."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", ())}
    ids.update(int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}))
    return frozenset(ids)


def _model_ids(tokenizer: Any, text: str) -> list[int] | None:
    """``text`` through the fast tokenizer's pipeline without the added-token pass (None: not a fast one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not text:
        return None if backend is None else []
    normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
    pieces = (
        backend.pre_tokenizer.pre_tokenize_str(normalized)
        if backend.pre_tokenizer is not None
        else [(normalized, (0, len(normalized)))]
    )
    return [tok.id for piece, _ in pieces for tok in backend.model.tokenize(piece)]


def _encode_piece(tokenizer: Any, text: str, added: frozenset[int]) -> list[int]:
    ids = _model_ids(tokenizer, text)
    if ids is None:  # a slow tokenizer: split_special_tokens is the best it offers
        ids = list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    if not added.intersection(ids):
        return ids
    if len(text) == 1:
        fallback = _model_ids(tokenizer, _REPLACEMENT)
        if fallback is None:
            fallback = list(tokenizer.encode(_REPLACEMENT, add_special_tokens=False))
        return [i for i in fallback if i not in added]
    return [i for ch in text for i in _encode_piece(tokenizer, ch, added)]


def encode_plain(tokenizer: Any, text: str, added: frozenset[int] | None = None) -> tuple[int, ...]:
    """Token ids of environment ``text`` that contain no added token id (see the module docstring)."""
    added = added_token_ids(tokenizer) if added is None else added
    ids = _encode_piece(tokenizer, text, added)
    if added.intersection(ids):  # the invariant, checked where it is cheap
        raise AssertionError("encode_plain produced an added token id")
    return tuple(int(i) for i in ids)
