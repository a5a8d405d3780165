"""A SIGKILLed learner's containers are removed by its reaper; dead owners' leftovers are swept.

A fake ``podman`` executable records every call (argv, pid, parent pid) and behaves as the client
would (``run`` blocks like a long command, ``ps`` lists what the test says exists); ContainerSandbox
and the reaper run their real code paths against it. The ``container`` tests at the end do the same
with podman and a local image (``make test-containers``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from thundersync_lightning.envs.sandbox import ContainerConfig, ContainerSandbox
from thundersync_lightning.envs.sandbox.base import wait_readable
from thundersync_lightning.envs.sandbox.reaper import container_name, host_key, process_start, reaper_for

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src")
DEADLINE_S = 15.0


@pytest.fixture
def fake_podman(tmp_path):
    """A fake ``podman``: appends {pid, ppid, argv} to calls.jsonl; ``run`` sleeps; ``ps`` prints ps.txt."""
    path = tmp_path / "bin" / "podman"
    path.parent.mkdir()
    path.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable} -S
        import json, os, sys, time
        args = sys.argv[1:]
        with open({str(tmp_path / "calls.jsonl")!r}, "a") as f:
            f.write(json.dumps({{"pid": os.getpid(), "ppid": os.getppid(), "argv": args}}) + "\\n")
        sub = next(a for a in args if not a.startswith("-"))
        if sub == "run":
            time.sleep(600)  # the container's command runs until someone removes it
        elif sub == "ps":
            try:
                print(open({str(tmp_path / "ps.txt")!r}).read())
            except OSError:
                pass
        """)
    )
    path.chmod(0o755)
    return str(path)


def calls(tmp_path) -> list[dict]:
    try:
        with open(tmp_path / "calls.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def wait_for(predicate, what: str):
    """Poll ``predicate`` until it returns something truthy (the file is written by other processes)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_gone(pid: int) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(wait_readable([fd], DEADLINE_S))
    finally:
        os.close(fd)


def removals(tmp_path) -> list[dict]:
    return [c for c in calls(tmp_path) if c["argv"][:2] == ["rm", "-f"]]


def test_a_sigkilled_learners_running_container_is_removed_by_its_reaper(
    tmp_path, fake_podman, sandbox_budget
):
    work = os.path.join(sandbox_budget.path, "w")
    os.mkdir(work)
    learner = textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {SRC!r})
        from thundersync_lightning.envs.sandbox import BoundedDir, ContainerConfig, ContainerSandbox
        budget = BoundedDir({work!r}, 1 << 20, 100)  # inside the test's own: unmounted with it
        box = ContainerSandbox(budget.path, "localhost/fake:1", 4_000_000,
                               ContainerConfig(engine={fake_podman!r}, runtime=""), budget=budget)
        print(box.reaper.process.pid, flush=True)
        box.run("sleep 1000", timeout_s=300)
        """)
    # --multiprocessing-fork: the package skips importing Lightning (seconds) in such processes.
    proc = subprocess.Popen(
        [sys.executable, "-c", learner, "--multiprocessing-fork"], stdout=subprocess.PIPE, text=True
    )
    client = None
    try:
        watchdog = int(proc.stdout.readline())
        run = wait_for(lambda: [c for c in calls(tmp_path) if "run" in c["argv"]], "the container's client")[
            0
        ]
        client = run["pid"]
        name = run["argv"][run["argv"].index("--name") + 1]
        owner = f"tsl.owner={host_key()}.{proc.pid}.{process_start(proc.pid)}"
        assert owner in run["argv"] and name.startswith(f"tsl-{proc.pid}-")
        proc.kill()  # SIGKILL: no finally, no atexit
        proc.wait()
        rm = wait_for(lambda: [c for c in removals(tmp_path) if name in c["argv"]], "rm -f of the container")
        assert rm[0]["argv"] == ["rm", "-f", "-t", "0", name] and rm[0]["ppid"] == watchdog  # by the reaper
        assert wait_gone(client)  # the client was killed too (it could still have been creating)
        assert wait_gone(watchdog)  # and the watchdog exits once done
        assert any(c["argv"][:2] == ["ps", "-a"] and f"label={owner}" in c["argv"] for c in calls(tmp_path))
    finally:
        proc.kill()
        proc.wait()
        if client is not None and not wait_gone(client):
            os.kill(client, signal.SIGKILL)


def test_a_learner_that_ends_normally_leaves_its_reaper_nothing_to_do(tmp_path, fake_podman, sandbox_budget):
    box = ContainerSandbox(
        sandbox_budget.path,
        "localhost/fake:1",
        4_000_000,
        ContainerConfig(engine=fake_podman, runtime=""),
        budget=sandbox_budget,
    )
    reaper = box.reaper
    name = container_name()
    reaper.started(name)
    reaper.finished(name)
    reaper.close()
    assert reaper.process.returncode == 0
    assert not removals(tmp_path)


def test_the_start_up_sweep_removes_only_containers_of_this_host_whose_owner_is_gone(tmp_path, fake_podman):
    child = subprocess.Popen(["true"])  # once reaped, its pid belongs to no one
    dead_pid = child.pid
    child.wait()
    me, my_start = os.getpid(), process_start(os.getpid())
    dead = f"tsl-{dead_pid}-123-0123456789ab"
    reused = f"tsl-cp-{me}-{my_start + 1}-0123456789ab"  # this pid, another (earlier owner's) start time
    mine = f"tsl-{me}-{my_start}-0123456789ab"
    (tmp_path / "ps.txt").write_text("\n".join([dead, reused, mine, "someone-elses-container"]))
    reaper = reaper_for(fake_podman, [])
    reaper.close()  # end of file at once: the watchdog exits once its sweep is done
    assert reaper.process.returncode == 0
    assert {c["argv"][-1] for c in removals(tmp_path)} == {dead, reused}
    listing = [c for c in calls(tmp_path) if c["argv"][:2] == ["ps", "-a"]][0]["argv"]
    assert f"label=tsl.host={host_key()}" in listing


# ---------------------------------------------------------------- with podman (make test-containers)

IMAGE = os.environ.get("THUNDERSYNC_TEST_IMAGE", "localhost/thundersync-pytest:latest")
PODMAN_DEADLINE_S = 90.0


def podman_names(engine: str, prefix: str) -> list[str]:
    out = subprocess.run(
        [engine, "--runtime", "/usr/sbin/runc", "ps", "-a", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [n for n in out.split() if n.startswith(prefix)]


@pytest.mark.container
@pytest.mark.parametrize("killed", ["learner", "client"])
def test_with_podman_a_sigkilled_client_or_learner_leaves_no_container(sandbox_budget, killed):
    from thundersync_lightning.envs.sandbox import find_engine, image_exists

    engine = find_engine("podman")
    if engine is None or not image_exists(IMAGE, engine):
        pytest.skip(f"needs podman and the local image {IMAGE} (scripts/build_test_image.sh)")
    work = os.path.join(sandbox_budget.path, "w")
    os.mkdir(work)
    learner = textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {SRC!r})
        from thundersync_lightning.envs.sandbox import BoundedDir, ContainerConfig, ContainerSandbox
        budget = BoundedDir({work!r}, 1 << 20, 100)  # inside the test's own: unmounted with it
        box = ContainerSandbox(budget.path, {IMAGE!r}, 4_000_000, ContainerConfig(engine="podman"),
                               budget=budget)
        print("ready", flush=True)
        result = box.run("sleep 1000", timeout_s=300)
        print("returned", result.exit_code, result.timed_out, flush=True)
        """)
    proc = subprocess.Popen(
        [sys.executable, "-c", learner, "--multiprocessing-fork"], stdout=subprocess.PIPE, text=True
    )
    prefix = f"tsl-{proc.pid}-"
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + PODMAN_DEADLINE_S
        while not podman_names(engine, prefix):  # the container exists (podman's own state, polled)
            assert time.monotonic() < deadline and proc.poll() is None, "no container started"
            time.sleep(0.2)
        (name,) = podman_names(engine, prefix)
        if killed == "learner":
            proc.kill()  # SIGKILL: no finally, no atexit; the reaper removes the container
        else:
            clients = [
                int(p) for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(int(p), name, "run")
            ]
            assert clients
            for pid in clients:
                os.kill(pid, signal.SIGKILL)  # the learner lives on and removes it once the client returns
        while podman_names(engine, prefix):
            assert time.monotonic() < deadline, f"container {name} outlived the SIGKILLed {killed}"
            time.sleep(0.2)
        if killed == "client":
            assert proc.stdout.readline().startswith("returned -9")  # the run saw its client killed
    finally:
        proc.kill()
        proc.wait()
        for leftover in podman_names(engine, prefix):
            subprocess.run(
                [engine, "--runtime", "/usr/sbin/runc", "rm", "-f", "-t", "0", leftover], capture_output=True
            )


def _cmdline_has(pid: int, *words: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return all(w.encode() in args for w in words)
