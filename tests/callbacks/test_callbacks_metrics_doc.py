"""docs/metrics.md is the single table of metric keys: it lists exactly what the monitors log."""

import re
from pathlib import Path

from thundersync_lightning.callbacks import (
    IdleTimeMonitor,
    MemoryMonitor,
    MFUMonitor,
    RolloutMetrics,
    StalenessMonitor,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def documented() -> dict[str, str]:
    """key -> monitor, from the rows of the "Keys" table."""
    section = DOC.read_text().split("## Keys", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_/0-9]+)` \|.*\| (\w+) \|$", section, flags=re.M)
    return dict(rows)


def test_the_keys_table_lists_every_logged_key_with_the_monitor_that_logs_it():
    logged = {
        key: cls.__name__
        for cls in (StalenessMonitor, MFUMonitor, MemoryMonitor, IdleTimeMonitor, RolloutMetrics)
        for key in cls().metric_keys
    }
    assert documented() == logged


def test_every_key_is_namespaced():
    assert all(k.split("/")[0] in {"train", "rollout", "perf", "memory"} for k in documented())
