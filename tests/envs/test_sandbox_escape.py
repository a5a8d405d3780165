"""Escape attempts against the bubblewrap sandbox: every one must be contained."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from ._support import needs_bwrap, processes_of, processes_of_tag

pytestmark = needs_bwrap


def test_the_command_runs_as_its_unprivileged_uid_without_capabilities(make_box):
    box = make_box()
    result = box.run("id -u; grep CapEff /proc/self/status; ls /root 2>&1; echo done")
    lines = result.text.splitlines()
    assert result.exit_code == 0
    assert lines[0] == str(box.uid)
    assert lines[1].split()[1] == "0000000000000000"
    assert "No such file or directory" in lines[2]


def test_the_sandbox_has_no_network_but_loopback(make_box):
    box = make_box()
    result = box.run(
        "cat /proc/net/dev; python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=5)\""
    )
    interfaces = [line.split(":")[0].strip() for line in result.text.splitlines() if ":" in line
                  and not line.startswith(("Inter", " face", "Traceback", "  File", "OSError"))]
    assert result.exit_code != 0
    assert "Network is unreachable" in result.text
    assert interfaces[:1] == ["lo"] and all(i == "lo" for i in interfaces if i.isidentifier())


def test_the_sandbox_cannot_connect_to_a_listener_on_host_loopback(make_box):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        # The listener is live: the host itself can connect.
        probe = socket.create_connection(("127.0.0.1", port), timeout=5)
        conn, _ = listener.accept()
        conn.close()
        probe.close()
        result = make_box().run(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)\""
        )
        assert result.exit_code != 0
        assert "Connection refused" in result.text
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing from the sandbox ever arrived
    finally:
        listener.close()


def test_writes_outside_the_workdir_fail_and_leave_the_host_untouched(make_box, sandbox_dir):
    box = make_box()
    marker = f"escape-{uuid.uuid4().hex}"
    targets = [f"/usr/{marker}", f"/etc/{marker}", f"/{marker}", f"/testbed/../{marker}",
               f"{sandbox_dir}/{marker}", f"/var/tmp/{marker}"]
    script = "; ".join(f"echo x > {t} && echo WROTE {t}" for t in targets)
    result = box.run(script + f"; echo x > /tmp/{marker} && echo private-tmp-ok; echo x > inside && echo inside-ok")
    assert "WROTE" not in result.text
    assert "private-tmp-ok" in result.text and "inside-ok" in result.text
    for t in targets + [f"/tmp/{marker}"]:
        assert not os.path.exists(t), t
    assert os.path.exists(os.path.join(box.workdir, "inside"))


def test_a_fork_bomb_hits_the_process_limit_and_dies_with_the_sandbox(make_box):
    box = make_box(timeout_s=5.0, nproc=32)
    result = box.run("bomb() { bomb | bomb & }; bomb; sleep 3; echo survived-fork-limit")
    assert result.timed_out or result.exit_code is not None
    assert processes_of(box.uid) == []
    # The host still forks fine and the next command in the same sandbox works.
    assert box.run("echo alive").text.strip() == "alive"


def test_a_memory_bomb_is_refused(make_box):
    box = make_box(memory_bytes=512 * 1024**2)
    result = box.run("python3 -c \"x = bytearray(4 * 1024**3); print('allocated')\"")
    assert result.exit_code != 0
    assert "MemoryError" in result.text
    assert "allocated" not in result.text


def test_a_gigabyte_of_output_is_cut_at_the_cap_and_the_writer_killed(make_box):
    box = make_box(max_output_bytes=64 * 1024, timeout_s=60.0)
    result = box.run("head -c 1000000000 /dev/zero | tr '\\0' x; echo finished")
    assert result.truncated and not result.timed_out
    assert result.exit_code is None
    assert len(result.output) < 64 * 1024 + 100
    assert b"finished" not in result.output
    assert processes_of(box.uid) == []


def test_a_large_file_is_cut_at_the_file_size_limit(make_box):
    box = make_box(fsize_bytes=16 * 1024**2)
    result = box.run("head -c 100000000 /dev/zero > big; echo status=$?; stat -c %s big")
    assert "status=0" not in result.text
    assert os.path.getsize(os.path.join(box.workdir, "big")) <= 16 * 1024**2


def test_an_infinite_loop_is_killed_at_the_deadline(make_box):
    box = make_box(timeout_s=2.0)
    result = box.run("while true; do :; done")
    assert result.timed_out and result.exit_code is None
    assert processes_of(box.uid) == []


def test_a_process_ignoring_sigterm_is_killed(make_box):
    box = make_box(timeout_s=2.0)
    result = box.run(
        "trap '' TERM; python3 -c \"import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True: pass\""
    )
    assert result.timed_out
    assert processes_of(box.uid) == []


def test_a_setsid_grandchild_is_dead_when_the_sandbox_returns(make_box):
    box = make_box()
    tag = "987654.321"
    result = box.run(f"setsid nohup sleep {tag} >/dev/null 2>&1 < /dev/null & disown; "
                     f"setsid bash -c 'trap \"\" TERM HUP; sleep {tag}' >/dev/null 2>&1 & echo started")
    assert result.exit_code == 0 and "started" in result.text
    assert processes_of(box.uid) == []
    assert processes_of_tag(tag) == []


def test_a_timed_out_setsid_grandchild_is_killed_too(make_box):
    box = make_box(timeout_s=2.0)
    result = box.run("setsid bash -c 'trap \"\" TERM; while :; do :; done' & sleep 100")
    assert result.timed_out
    assert processes_of(box.uid) == []
