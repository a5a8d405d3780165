"""Moved module paths keep working for one release, with a DeprecationWarning; the repo uses new ones."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from thundersync_lightning.core.moved_modules import MOVED, MOVED_NAMES

ROOT = Path(__file__).resolve().parents[1]
FROM_IMPORT = re.compile(r"from thundersync_lightning((?:\.\w+)*) import ([\w, ()\n]+)")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_and_is_the_new_module(old):
    new = importlib.import_module(f"thundersync_lightning.{MOVED[old]}")
    sys.modules.pop(f"thundersync_lightning.{old}", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(f"thundersync_lightning.{old}")
    assert module is new
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert f"thundersync_lightning.{old} moved to thundersync_lightning.{MOVED[old]}" in " ".join(messages)


@pytest.mark.parametrize(
    ("package", "name"), sorted((package, name) for package, names in MOVED_NAMES.items() for name in names)
)
def test_a_name_a_package_stopped_exporting_warns_and_is_the_same_object(package, name):
    new = importlib.import_module(f"thundersync_lightning.{MOVED_NAMES[package][name]}")
    old = importlib.import_module(f"thundersync_lightning.{package}")
    assert name not in old.__all__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(old, name)
    assert value is getattr(new, name)
    messages = " ".join(str(w.message) for w in caught if issubclass(w.category, DeprecationWarning))
    assert (
        f"thundersync_lightning.{package}.{name} moved to thundersync_lightning.{MOVED_NAMES[package][name]}"
        in messages
    )
    with pytest.raises(AttributeError, match="no attribute 'never_there'"):
        old.never_there  # noqa: B018 - the attribute access is the test


def test_an_old_class_path_in_a_config_resolves_to_the_same_class():
    from jsonargparse import ArgumentParser

    from thundersync_lightning.rollout import VLLMEngineConfig

    parser = ArgumentParser()
    parser.add_argument("--engine", type=object)
    cfg = parser.parse_args(
        ["--engine", '{"class_path": "thundersync_lightning.rollout.vllm_config.VLLMEngineConfig"}']
    )
    init = parser.instantiate_classes(cfg)
    assert type(init.engine) is VLLMEngineConfig


def test_the_repo_itself_uses_only_new_paths():
    old = "|".join(re.escape(f"thundersync_lightning.{o}") for o in MOVED)
    pattern = re.compile(rf"(?:{old})(?![\w])")
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    hits = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".md", ".yaml", ".yml", ".toml"} and path.name != "Makefile":
            continue
        if name in {"src/thundersync_lightning/core/moved_modules.py", "tests/test_moved_modules.py"}:
            continue
        if not path.is_file():
            continue
        text = path.read_text()
        hits += [f"{name}: {m.group(0)}" for m in pattern.finditer(text)]
        for m in FROM_IMPORT.finditer(text):  # from thundersync_lightning.core import group
            package = m.group(1).lstrip(".")
            for alias in m.group(2).replace("(", "").replace(")", "").split(","):
                module = f"{package}.{alias.strip().split(' as ')[0]}".lstrip(".")
                if module in MOVED or alias.strip().split(" as ")[0] in MOVED_NAMES.get(package, {}):
                    hits.append(f"{name}: {m.group(0)}")
    assert hits == []
