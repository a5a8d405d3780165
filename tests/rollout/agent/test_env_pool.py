"""The environment pool resolves every call exactly once, without raising or hanging."""

from __future__ import annotations

import threading

from thundersync_lightning.rollout import EnvPool


def test_a_value_an_exception_and_a_timeout_each_resolve_to_an_outcome():
    pool = EnvPool(3)
    never = threading.Event()
    try:
        ok = pool.submit(lambda: 42, timeout_s=5.0, what="verdict")
        boom = pool.submit(lambda: 1 / 0, timeout_s=5.0, what="verdict")
        stuck = pool.submit(never.wait, timeout_s=0.05, what="verdict")
        assert ok.result(timeout=10).value == 42 and ok.result().ok
        assert boom.result(timeout=10).failure == "verdict raised ZeroDivisionError: division by zero"
        assert stuck.result(timeout=10).failure == "verdict timed out after 0.05 s"
    finally:
        never.set()
        pool.shutdown()


def test_a_late_result_after_a_timeout_is_discarded():
    pool = EnvPool(1)
    release = threading.Event()
    try:
        fut = pool.submit(lambda: release.wait() and "late", timeout_s=0.05, what="step")
        first = fut.result(timeout=10)
        release.set()
        pool.submit(lambda: None, timeout_s=None).result(timeout=10)  # the stuck call has returned by now
        assert fut.result() is first and first.failure is not None
    finally:
        pool.shutdown()


def test_calls_after_shutdown_resolve_as_failures():
    pool = EnvPool(1)
    pool.shutdown()
    assert "shut down" in pool.submit(lambda: 1, timeout_s=1.0).result(timeout=10).failure


def test_a_free_worker_takes_the_lowest_priority_then_the_oldest_queued_call():
    pool = EnvPool(workers=1)
    started, release = threading.Event(), threading.Event()
    order: list[str] = []

    def blocker() -> None:
        started.set()
        release.wait(10)

    first = pool.submit(blocker, timeout_s=None)
    assert started.wait(10)  # the only worker is busy: everything below queues
    calls = [
        pool.submit(lambda name=name: order.append(name), timeout_s=None, priority=priority)
        for name, priority in [("prepared-1", 1), ("prepared-2", 1), ("step-1", 0), ("step-2", 0)]
    ]
    release.set()
    assert first.result(10).ok and all(c.result(10).ok for c in calls)
    assert order == ["step-1", "step-2", "prepared-1", "prepared-2"]
    pool.shutdown()


def test_a_call_past_its_timeout_gives_its_slot_to_a_new_thread_so_queued_calls_still_run(caplog):
    pool = EnvPool(workers=1)
    never = threading.Event()
    try:
        stuck = pool.submit(never.wait, timeout_s=0.05, what="step")
        after = pool.submit(
            lambda: "ran", timeout_s=None
        )  # queued behind the only thread, which never returns
        assert stuck.result(timeout=10).failure == "step timed out after 0.05 s"
        assert after.result(timeout=10).value == "ran"
        assert pool.hung == 1 and "step timed out after 0.05 s; its thread cannot be stopped" in caplog.text
    finally:
        never.set()
        pool.shutdown()


def test_calls_queued_at_shutdown_resolve_as_not_run():
    pool = EnvPool(workers=1)
    started, release = threading.Event(), threading.Event()
    try:
        busy = pool.submit(lambda: started.set() or release.wait(), timeout_s=None)
        assert started.wait(10)  # the only thread is busy: the next call queues
        queued = pool.submit(lambda: 1, timeout_s=None, what="reset")
        pool.shutdown()
        assert queued.result(timeout=10).failure == "reset not run: the environment pool is shut down"
    finally:
        release.set()
    assert busy.result(timeout=10).ok
