"""A tokenizer directory that is missing or empty is named as such, never reported as a failed
download from the Hugging Face Hub (nothing is downloaded, online or not)."""

from __future__ import annotations

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.envs.chat import ChatRenderer
from thundersync_lightning.envs.codec import HFTokenizerCodec
from thundersync_lightning.envs.tokens import load_tokenizer


@pytest.mark.parametrize(
    "load",
    [
        lambda path: load_tokenizer(path),
        lambda path: ChatRenderer(path),
        lambda path: HFTokenizerCodec(path).vocab_size,
    ],
    ids=["load_tokenizer", "ChatRenderer", "HFTokenizerCodec"],
)
def test_a_missing_tokenizer_directory_is_named_without_an_internet_error(tmp_path, monkeypatch, load):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # online: transformers would try the Hub
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load("models/my-tokenizer")
    message = str(err.value)
    assert f"tokenizer_path 'models/my-tokenizer (from {tmp_path})' does not exist" in message
    assert "huggingface.co" not in message and "internet" not in message


def test_a_directory_without_tokenizer_files_says_it_holds_no_tokenizer(tmp_path):
    with pytest.raises(ConfigError, match=r"holds no tokenizer \(none of tokenizer.json"):
        load_tokenizer(str(tmp_path), "--tokenizer")
