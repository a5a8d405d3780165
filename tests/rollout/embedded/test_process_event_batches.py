"""The embedded engine's event pipe: messages queued together travel as one batch, in order."""

from __future__ import annotations

import multiprocessing as mp
import queue

import pytest

from thundersync_lightning.rollout.embedded.process import EventReader, ProcessGone
from thundersync_lightning.rollout.embedded.worker import take_batch


def test_a_batch_is_every_message_queued_up_to_the_stop_sentinel_in_order() -> None:
    q: queue.SimpleQueue = queue.SimpleQueue()
    for msg in (("event", 1, "a"), ("event", 1, "b"), ("applied", 3)):
        q.put(msg)
    assert take_batch(q) == ([("event", 1, "a"), ("event", 1, "b"), ("applied", 3)], False)
    q.put(("event", 2, "c"))
    q.put(None)
    q.put(("event", 2, "late"))  # after the sentinel: not taken
    assert take_batch(q) == ([("event", 2, "c")], True)
    assert q.get_nowait() == ("event", 2, "late")
    q.put(None)
    assert take_batch(q) == ([], True)


def test_the_reader_hands_out_a_batch_one_message_at_a_time_before_later_ones_and_then_end_of_file() -> None:
    read, write = mp.Pipe(duplex=False)
    reader = EventReader(read)
    assert reader.receive(0.0) is None
    write.send(("batch", [("event", 1, "a"), ("event", 1, "b"), ("applied", 3)]))
    write.send(("event", 1, "c"))
    write.send(("batch", [("event", 2, "d"), ("fatal", "boom")]))
    write.close()  # the process died: what it sent is still handed out, then end-of-file
    got = [reader.receive(1.0) for _ in range(6)]
    assert got == [
        ("event", 1, "a"),
        ("event", 1, "b"),
        ("applied", 3),
        ("event", 1, "c"),
        ("event", 2, "d"),
        ("fatal", "boom"),
    ]
    with pytest.raises(ProcessGone):
        reader.receive(1.0)
    reader.close()
    reader.close()  # idempotent
