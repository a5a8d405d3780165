"""Read an offline W&B run (``<dir>/wandb/offline-run-*/run-*.wandb``) back into Python.

The file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of records, each with a 7-byte
header (crc32: 4, length: 2 little-endian, type: 1 = full, 2 = first, 3 = middle, 4 = last) and
a payload that is a serialized ``wandb_internal_pb2.Record``. A block's last < 7 bytes are padding.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from collections.abc import Iterator
from typing import Any

HEADER_LEN = 7
BLOCK_LEN = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    pos, pending = HEADER_LEN, b""
    while pos + HEADER_LEN <= len(data):
        left = BLOCK_LEN - pos % BLOCK_LEN
        if left < HEADER_LEN:  # block trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER_LEN])
        body = data[pos + HEADER_LEN : pos + HEADER_LEN + length]
        pos += HEADER_LEN + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            yield pending + body
            pending = b""
        elif kind == 0 and length == 0:  # zero padding
            pos += left - HEADER_LEN
        else:
            raise ValueError(f"bad record type {kind} at {pos}")


def finish_wandb() -> None:
    """Finish the current run and wait until its files are complete: ``wandb.finish()`` can return
    before the native core has written the last records; ``wandb.teardown()`` waits for it."""
    import wandb

    wandb.finish()
    wandb.teardown()


def read_offline_run(save_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"history": [row, ...], "config": {...}}`` of the single offline run under ``save_dir``."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(os.path.join(save_dir, "wandb", "offline-run-*", "run-*.wandb"))
    with open(path, "rb") as f:
        data = f.read()
    history: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    for payload in _payloads(data):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            history.append(row)
        elif kind == "config":
            for item in rec.config.update:
                key = item.key or "/".join(item.nested_key)
                config[key] = json.loads(item.value_json)
    return {"history": history, "config": config}
