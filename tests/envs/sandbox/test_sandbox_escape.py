"""Escape attempts against the bubblewrap sandbox: every one must be contained."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import select
import shlex
import shutil
import socket
import struct
import subprocess
import tempfile
import uuid

import pytest

from thundersync_lightning.envs.sandbox import (
    BwrapConfig,
    BwrapSandbox,
    SandboxLimits,
    bwrap_available,
    chown_tree,
)
from thundersync_lightning.envs.sandbox.cgroups import probe
from thundersync_lightning.envs.sandbox.fs import BoundedDir, remove_tree

from .._support import TEST_POOL, needs_bwrap, processes_of, processes_of_tag

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
        'cat /proc/net/dev; python3 -c "import socket; '
        "socket.create_connection(('1.1.1.1', 53), timeout=5)\""
    )
    interfaces = [
        line.split(":")[0].strip()
        for line in result.text.splitlines()
        if ":" in line and not line.startswith(("Inter", " face", "Traceback", "  File", "OSError"))
    ]
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
    targets = [
        f"/usr/{marker}",
        f"/etc/{marker}",
        f"/{marker}",
        f"/testbed/../{marker}",
        f"{sandbox_dir}/{marker}",
        f"/var/tmp/{marker}",
    ]
    script = "; ".join(f"echo x > {t} && echo WROTE {t}" for t in targets)
    result = box.run(
        script + f"; echo x > /tmp/{marker} && echo private-tmp-ok; echo x > inside && echo inside-ok"
    )
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
        'while True: pass"'
    )
    assert result.timed_out
    assert processes_of(box.uid) == []


def test_a_setsid_grandchild_is_dead_when_the_sandbox_returns(make_box):
    box = make_box()
    tag = "987654.321"
    result = box.run(
        f"setsid nohup sleep {tag} >/dev/null 2>&1 < /dev/null & disown; "
        f"setsid bash -c 'trap \"\" TERM HUP; sleep {tag}' >/dev/null 2>&1 & echo started"
    )
    assert result.exit_code == 0 and "started" in result.text
    assert processes_of(box.uid) == []
    assert processes_of_tag(tag) == []


def test_a_timed_out_setsid_grandchild_is_killed_too(make_box):
    box = make_box(timeout_s=2.0)
    result = box.run("setsid bash -c 'trap \"\" TERM; while :; do :; done' & sleep 100")
    assert result.timed_out
    assert processes_of(box.uid) == []


# ---------------------------------------------------------------- resources bounded by the kernel

# Forks N children that each allocate and touch ``mb`` MiB, report on a pipe, then wait for the
# parent's go: all N hold their memory at the same time (no sleeps). Prints how many got there.
_HOLDERS = r"""
import os, sys
n, mb = int(sys.argv[1]), int(sys.argv[2])
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
pids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.close(ready_r); os.close(go_w)
        block = bytearray(mb * 1024 * 1024)
        block[::4096] = b"x" * len(block[::4096])
        os.write(ready_w, b"1")
        os.close(ready_w)
        os.read(go_r, 1)
        os._exit(0)
    pids.append(pid)
os.close(ready_w); os.close(go_r)
got = 0
while got < n:
    chunk = os.read(ready_r, n)
    if not chunk:
        break
    got += len(chunk)
# a holder the OOM killer took after it reported does not hold: count the living ones
alive = sum(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in pids)
print("holding", min(got, alive), flush=True)
os.close(go_w)
"""


def test_n_processes_cannot_use_n_times_the_memory_limit(make_box):
    script = f"python3 -c {shlex.quote(_HOLDERS)} 3 100"
    # Before (per-process RLIMIT_AS only): 3 x 100 MiB under a 192 MiB limit all succeed.
    unbounded = make_box(memory_bytes=192 * 1024**2, cgroups=False).run(script)
    assert "holding 3" in unbounded.text
    box = make_box(memory_bytes=192 * 1024**2)
    if box.cgroup_support is None or "memory" not in box.cgroup_support.parents:
        pytest.skip(f"this host gives us no memory cgroup: {probe().describe_missing()}")
    bounded = box.run(script)
    held = [int(line.split()[1]) for line in bounded.text.splitlines() if line.startswith("holding")]
    assert not bounded.timed_out
    assert held == [] or held[0] < 3  # the kernel OOM-kills within the sandbox's group
    assert processes_of(box.uid) == []


def test_tmpfs_pages_count_against_the_memory_limit(make_box):
    box = make_box(memory_bytes=128 * 1024**2, tmpfs_bytes=1024**3)
    if box.cgroup_support is None or "memory" not in box.cgroup_support.parents:
        pytest.skip("no memory cgroup on this host")
    # /tmp may hold 1 GiB, but what is written there is memory: it stops near the 128 MiB limit.
    result = box.run("head -c 400000000 /dev/zero > /tmp/fill; stat -c %s /tmp/fill")
    sizes = [int(w) for w in result.text.split() if w.isdigit()]
    assert not sizes or sizes[-1] < 200 * 1024**2


def test_dev_is_a_small_private_tmpfs_with_only_the_basic_devices(make_box):
    box = make_box(dev_bytes=4 * 1024**2)
    # Before: `--dev` gave a /dev tmpfs of half the host's RAM, writable through /dev/shm.
    result = box.run(
        "head -c 100000000 /dev/zero > /dev/shm/fill; echo status=$?; stat -c %s /dev/shm/fill; "
        "ls /dev; echo x > /dev/null && head -c 4 /dev/urandom | wc -c"
    )
    assert "No space left on device" in result.text and "status=0" not in result.text
    sizes = [int(w) for w in result.text.split() if w.isdigit() and int(w) > 1000]
    assert sizes and sizes[0] <= 4 * 1024**2
    listed = set(result.text.split())
    assert {"null", "zero", "full", "random", "urandom", "tty", "shm"} <= listed
    assert not listed & {"sda", "vda", "mem", "kmsg", "fuse", "net", "pts", "ptmx"}
    assert result.text.rstrip().endswith("4")


_SYSCALLS = r"""
import ctypes, errno, os, platform
libc = ctypes.CDLL(None, use_errno=True)
x86 = platform.machine() == "x86_64"
calls = {  # name: (x86_64 nr, aarch64 nr, args)
    "keyctl": (250, 219, (0, -3)), "add_key": (248, 217, (b"user", b"k", b"v", 1, -3)),
    "request_key": (249, 218, (b"user", b"k", None, 0)), "io_uring_setup": (425, 425, (1, None)),
    "bpf": (321, 280, (0, None, 0)), "perf_event_open": (298, 241, (None, 0, -1, -1, 0)),
    "userfaultfd": (323, 282, (0,)), "unshare": (272, 97, (0x10000000,)), "setns": (308, 268, (0, 0)),
    "mount": (165, 40, (b"none", b"/tmp", b"tmpfs", 0, None)),
    "ptrace": (101, 117, (0, 0, 0, 0)),  # PTRACE_TRACEME
    "pidfd_getfd": (438, 438, (0, 0, 0)),
}
if x86:
    calls["modify_ldt"] = (154, None, (0, None, 0))  # read the LDT (x86 only)
for name, (a, b, args) in calls.items():
    r = libc.syscall(a if x86 else b, *args)
    e = ctypes.get_errno()
    print(name, "EPERM" if r < 0 and e == errno.EPERM
          else f"r={r} errno={errno.errorcode.get(e, e) if r < 0 else 0}")
"""


def test_seccomp_denies_keyrings_io_uring_bpf_perf_userfaultfd_namespaces_mount_and_ptrace(make_box):
    script = f"python3 -c {shlex.quote(_SYSCALLS)}"
    # Before (no filter): keyctl and add_key work and io_uring_setup reaches the kernel.
    before = dict(line.split(" ", 1) for line in make_box(seccomp=False).run(script).text.splitlines())
    assert (
        before["keyctl"] != "EPERM" and before["add_key"] != "EPERM" and before["io_uring_setup"] != "EPERM"
    )
    after = dict(line.split(" ", 1) for line in make_box().run(script).text.splitlines())
    assert after == {name: "EPERM" for name in after} and len(after) == (
        13 if platform.machine() == "x86_64" else 12
    )


# What lets a sandbox evict a page of a shared read-only file, or see whether it is cached without a
# clock: a grading run and an episode of its task could signal through /usr's page cache with them.
_PAGE_CACHE = r"""
import ctypes, errno, mmap, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
x86 = platform.machine() == "x86_64"
path = os.path.realpath("/usr/bin/python3")
fd = os.open(path, os.O_RDONLY)
def show(name, fn):
    try:
        r = fn()
        print(name, "ok" if r is None or r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"))
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)))
show("fadvise_dontneed", lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED))
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long)
libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
addr = libc.mmap(None, 1 << 16, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
for name, advice in (("madvise_pageout", 21), ("madvise_cold", 20), ("madvise_dontneed", mmap.MADV_DONTNEED),
                     ("madvise_willneed", mmap.MADV_WILLNEED)):
    show(name, lambda advice=advice: libc.madvise(addr, 1 << 16, advice))
pidfd = os.pidfd_open(os.getpid())
iov = (ctypes.c_size_t * 2)(addr, 1 << 16)
show("process_madvise", lambda: libc.syscall(440, pidfd, iov, 1, 21, 0))
stat = (ctypes.c_uint64 * 8)()
show("cachestat", lambda: libc.syscall(451, fd, (ctypes.c_uint64 * 2)(0, 0), stat, 0))
show("preadv2_nowait", lambda: os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT))
show("preadv", lambda: os.preadv(fd, [bytearray(4096)], 0))
"""


def test_seccomp_denies_evicting_or_probing_the_page_cache_of_shared_files(make_box):
    script = f"python3 -c {shlex.quote(_PAGE_CACHE)}"
    before = dict(line.split(" ", 1) for line in make_box(seccomp=False).run(script).text.splitlines())
    # Before: every one of them worked on /usr/bin/python3 (read-only bind, shared by all sandboxes).
    assert before["fadvise_dontneed"] == "ok" and before["madvise_pageout"] == "ok", before
    assert before["process_madvise"] == "ok" and before["preadv2_nowait"] == "ok", before
    after = dict(line.split(" ", 1) for line in make_box().run(script).text.splitlines())
    assert after == {
        "fadvise_dontneed": "EPERM",
        "madvise_pageout": "EPERM",
        "madvise_cold": "EPERM",
        "madvise_dontneed": "ok",
        "madvise_willneed": "ok",
        "process_madvise": "EPERM",
        "cachestat": "EPERM",
        "preadv2_nowait": "ENOTSUP",
        "preadv": "ok",
    }, after


def test_the_seccomp_program_checks_the_architecture_first():
    from thundersync_lightning.envs.sandbox.seccomp import build_filter

    for arch, audit in (("x86_64", 0xC000003E), ("aarch64", 0xC00000B7)):
        prog = build_filter(arch)
        insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
        assert insns[0] == (0x20, 0, 0, 4)  # load seccomp_data.arch
        assert insns[1] == (0x15, 1, 0, audit) and insns[2] == (0x06, 0, 0, 0x80000000)  # else kill
        assert insns[-1] == (0x06, 0, 0, 0x00050000 | errno.EPERM)
        assert insns[-2] == (0x06, 0, 0, 0x7FFF0000)  # an allowed socket family
        assert insns[-3] == (0x06, 0, 0, 0x00050000 | errno.EAFNOSUPPORT)  # a refused one


# Every socket family, one at a time, through socket(2) and socketpair(2) with each type; the
# family also with bits above 32 set (the kernel reads an int: the filter must compare the same).
_FAMILIES = r"""
import ctypes, errno, json, os, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SOCKET, SOCKETPAIR = (41, 53) if platform.machine() == "x86_64" else (198, 199)
types = (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET)
out = {}
def attempt(nr, family, kind):
    pair = (ctypes.c_int * 2)()
    r = libc.syscall(nr, ctypes.c_long(family), kind, 0, pair)
    e = ctypes.get_errno()
    if r < 0:
        return errno.errorcode.get(e, str(e))
    os.close(r if nr == SOCKET else pair[0])
    if nr == SOCKETPAIR:
        os.close(pair[1])
    return "ok"
for family in range(64):
    out[family] = {f"{call}/{kind}/{high}": attempt(nr, family | (high << 32), kind)
                   for call, nr in (("socket", SOCKET), ("socketpair", SOCKETPAIR))
                   for kind in types for high in (0, 1)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def socket_families():
    """What socket(2)/socketpair(2) gave for every family inside the sandbox, with and without the filter."""
    if not bwrap_available():
        pytest.skip("needs root and bubblewrap")
    results = {}
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        os.chmod(root, 0o711)
        for seccomp in (False, True):
            lease = TEST_POOL.acquire()
            try:
                work = os.path.join(root, f"w{lease.uid}")
                os.mkdir(work)
                budget = BoundedDir(work, 16 * 1024**2, 1000, 0o700)
                try:
                    chown_tree(work, lease.uid)
                    box = BwrapSandbox(
                        work,
                        lease.uid,
                        BwrapConfig(SandboxLimits(timeout_s=60.0), seccomp=seccomp),
                        budget=budget,
                    )
                    run = box.run(f"python3 -c {shlex.quote(_FAMILIES)}")
                finally:
                    budget.remove()
            finally:
                lease.release()
            assert run.exit_code == 0, run.text
            results[seccomp] = {int(k): v for k, v in json.loads(run.text).items()}
    return results


def test_without_the_filter_some_family_outside_the_network_namespace_opens(socket_families):
    # Before: netlink (and AF_VSOCK on a VM, AF_ALG, ...) open inside an empty network namespace.
    opened = {f for f, r in socket_families[False].items() if f not in (1, 2, 10) and "ok" in r.values()}
    assert 16 in opened  # AF_NETLINK


@pytest.mark.parametrize("family", [f for f in range(64) if f not in (1, 2, 10)])
def test_every_other_socket_family_is_refused_by_socket_and_socketpair(socket_families, family):
    results = socket_families[True][family]
    assert set(results.values()) == {"EAFNOSUPPORT"}, results


def test_an_abstract_unix_socket_of_the_host_or_another_sandbox_is_out_of_reach(make_box):
    name = f"tsl-probe-{uuid.uuid4().hex}"
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    host.bind("\0" + name)  # abstract names live in the network namespace
    host.listen(1)
    try:
        probe = (
            f"import socket; s = socket.socket(socket.AF_UNIX); s.connect('\\0{name}'); print('connected')"
        )
        result = make_box().run(f"python3 -c {shlex.quote(probe)}")
    finally:
        host.close()
    assert "connected" not in result.text and "ConnectionRefusedError" in result.text, result.text


def test_unix_inet_and_inet6_sockets_still_work_inside(socket_families, make_box):
    for family in (1, 2, 10):
        assert socket_families[True][family]["socket/1/0"] == "ok"  # SOCK_STREAM
    assert socket_families[True][1]["socketpair/1/0"] == "ok"
    # The namespace's own loopback serves; the family with high bits set is the same family.
    served = make_box().run(
        "python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1); "
        "c = socket.create_connection(s.getsockname()); print('served', s.accept()[1][0])\""
    )
    assert "served 127.0.0.1" in served.text, served.text


def test_the_hosts_session_keyring_is_not_visible_inside(make_box):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    desc = f"tsl-secret-{uuid.uuid4().hex}".encode()
    # This test process joins a fresh session keyring holding a secret key (KEYCTL_JOIN_SESSION_KEYRING).
    assert libc.syscall(250, 1, None) > 0
    assert libc.syscall(248, b"user", desc, b"payload", 7, -3) > 0  # add_key to @s
    box = make_box(seccomp=False)  # the keyring separation must hold even without the filter
    uid = str(box.uid)
    # Before: a child that merely switched uid still possesses (and can list) the host's keyring.
    plain = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "cat", "/proc/keys"],
        capture_output=True,
        text=True,
    )
    assert desc.decode() in plain.stdout
    inside = box.run(
        'cat /proc/keys; python3 -c "import ctypes; l = ctypes.CDLL(None); '
        "print('session', l.syscall(250, 0, -3, 0))\""
    )
    assert desc.decode() not in inside.text
    assert inside.exit_code == 0


def test_a_command_cgroup_is_nested_in_our_own_group_limited_and_removed():
    from thundersync_lightning.envs.sandbox.cgroups import CommandCgroup

    support = probe()
    if not support.parents:
        pytest.skip(f"no writable cgroup here: {support.describe_missing()}")
    group = CommandCgroup(support, memory_bytes=300 * 1024**2, pids=77, cpus=0.5)
    try:
        for d in group.dirs:
            assert os.path.dirname(d) in support.parents.values()
        files = {os.path.basename(os.path.dirname(f)): f for f in group.procs_files}
        assert len(files) == 1  # one fresh name, in each hierarchy
        texts = {}
        for d in group.dirs:
            for name in ("memory.limit_in_bytes", "memory.max", "pids.max", "cpu.cfs_quota_us", "cpu.max"):
                if os.path.exists(os.path.join(d, name)):
                    with open(os.path.join(d, name)) as f:
                        texts[name] = f.read().split()
        assert texts.get("memory.limit_in_bytes", texts.get("memory.max")) == [str(300 * 1024**2)]
        assert texts["pids.max"] == ["77"]
        assert texts.get("cpu.cfs_quota_us") == ["50000"] or texts.get("cpu.max") == ["50000", "100000"]
    finally:
        dirs = list(group.dirs)
        group.remove()
    assert not any(os.path.exists(d) for d in dirs)


def test_removal_of_a_1000_deep_tree_neither_recurses_nor_raises(tmp_path):
    def deep(root: str) -> None:
        os.mkdir(root)
        fd = os.open(root, os.O_RDONLY)
        for _ in range(1000):
            os.mkdir("d" * 20, dir_fd=fd)
            nxt = os.open("d" * 20, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(fd)

    before, after = str(tmp_path / "before"), str(tmp_path / "after")
    deep(before)
    deep(after)
    with pytest.raises(RecursionError):
        shutil.rmtree(before)  # what clean-up used: the directory (and the uid) leaked
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))  # depth needs no fds either
    try:
        assert remove_tree(after)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not os.path.exists(after)
    assert remove_tree(before)


def test_sandboxes_run_while_the_host_process_holds_more_than_1024_fds(make_box):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2048:
        pytest.skip("RLIMIT_NOFILE hard limit below 2048")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open("/dev/null", os.O_RDONLY))
        with pytest.raises(ValueError):
            select.select([held[-1]], [], [], 0)  # what the runner used to wait with
        box = make_box(timeout_s=2.0)
        assert box.run("echo alive").text.strip() == "alive"
        assert box.run("sleep 100").timed_out  # the deadline path waits on fds > 1024 too
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _workspace(**kwargs):
    from thundersync_lightning.envs.code import LocalCodeTasks

    source = LocalCodeTasks(
        names=["leap_year"],
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_955_000,
        uid_count=16,
        **kwargs,
    )
    env = source.make_env(source.all_tasks[0], seed=0)
    env.reset()
    return env


def test_the_workspace_has_a_disk_and_an_inode_budget(make_box):
    fill = (
        "head -c 12000000 /dev/zero > big1; head -c 12000000 /dev/zero > big2; echo bytes=$(cat big* | wc "
        "-c); mkdir many && for i in $(seq 3000); do : > many/f$i || break; "
        "done; echo files=$(ls many | wc -l)"
    )
    # Before: the workdir was a plain host directory: no budget beyond the per-file size limit.
    before = make_box(fsize_bytes=16 * 1024**2).run(fill)
    assert "bytes=24000000" in before.text and "files=3000" in before.text
    env = _workspace(disk_bytes=16 * 1024**2, disk_inodes=1000)
    try:
        if not env.workspace._budget.enforced:
            pytest.skip(f"this host cannot mount a tmpfs: {env.workspace._budget.why_not}")
        after = env.workspace.run(fill)
        assert "No space left on device" in after.text
        written = int(after.text.split("bytes=")[1].split()[0])
        files = int(after.text.split("files=")[1].split()[0])
        assert written <= 16 * 1024**2 and files < 1000
    finally:
        env.close()


def test_closing_a_workspace_with_a_1000_deep_tree_frees_the_directory_and_the_uid():
    from thundersync_lightning.envs.sandbox import UidPool

    env = _workspace()
    ws = env.workspace
    directory, uid = ws._dir, ws._lease.uid
    name = "d" * 40  # 1000 levels: ~41 kB of path, far past PATH_MAX
    try:
        made = ws.run(
            f"python3 -c \"import os\nfor _ in range(1000): os.mkdir('{name}'); os.chdir('{name}')\n"
            "print('deep')\""
        )
        assert "deep" in made.text
    finally:
        env.close()  # must not raise
    assert not os.path.exists(directory) and ws._lease is None
    again = UidPool(base=uid, size=1).acquire()  # the uid is free for the next sandbox
    again.release()


def test_limits_the_host_cannot_enforce_are_named_in_a_warning_or_an_error(
    monkeypatch, sandbox_budget, caplog
):
    import logging

    from thundersync_lightning.envs.sandbox import BwrapConfig, BwrapSandbox, SandboxError
    from thundersync_lightning.envs.sandbox import bwrap as bwrap_module
    from thundersync_lightning.envs.sandbox.cgroups import CgroupSupport

    why = "/sys/fs/cgroup/x is not writable by us"
    monkeypatch.setattr(
        bwrap_module, "probe", lambda: CgroupSupport(0, {}, {c: why for c in ("memory", "pids", "cpu")})
    )
    monkeypatch.setattr(bwrap_module, "_warned", set())
    with pytest.raises(SandboxError, match="not enforced for: memory, pids, cpu"):
        BwrapSandbox(
            sandbox_budget.path, 4_000_000, BwrapConfig(require_kernel_limits=True), budget=sandbox_budget
        )
    with caplog.at_level(logging.WARNING, logger=bwrap_module.__name__):
        box = BwrapSandbox(sandbox_budget.path, 4_000_000, BwrapConfig(), budget=sandbox_budget)
    assert box.cgroup_support is None
    assert "not enforced for: memory, pids, cpu" in caplog.text and why in caplog.text


def test_a_sandbox_without_a_disk_budget_holding_its_writable_paths_is_a_constructor_error(
    sandbox_budget, tmp_path, monkeypatch
):
    from thundersync_lightning.envs.sandbox import ContainerSandbox, SandboxError
    from thundersync_lightning.envs.sandbox import container as container_module

    inside = os.path.join(sandbox_budget.path, "w")
    os.mkdir(inside)
    with pytest.raises(TypeError, match="budget"):
        BwrapSandbox(inside, 4_000_000, BwrapConfig())  # type: ignore[call-arg]
    with pytest.raises(SandboxError, match="not a BoundedDir"):
        BwrapSandbox(inside, 4_000_000, BwrapConfig(), budget=None)
    with pytest.raises(SandboxError, match="outside the disk budget"):
        BwrapSandbox(str(tmp_path), 4_000_000, BwrapConfig(), budget=sandbox_budget)
    with pytest.raises(SandboxError, match="outside the disk budget"):
        BwrapSandbox(inside, 4_000_000, BwrapConfig(), budget=sandbox_budget, binds={str(tmp_path): "/data"})
    with pytest.raises(SandboxError, match="outside the disk budget"):  # a link out of the budget is followed
        os.symlink(str(tmp_path), os.path.join(sandbox_budget.path, "out"))
        BwrapSandbox(
            os.path.join(sandbox_budget.path, "out"), 4_000_000, BwrapConfig(), budget=sandbox_budget
        )
    unenforced = BoundedDir.__new__(BoundedDir)
    unenforced.path, unenforced.enforced, unenforced.why_not = sandbox_budget.path, False, "no CAP_SYS_ADMIN"
    with pytest.raises(SandboxError, match="not enforced"):
        BwrapSandbox(inside, 4_000_000, BwrapConfig(require_kernel_limits=True), budget=unenforced)
    monkeypatch.setattr(container_module, "find_engine", lambda engine="auto": "/usr/bin/podman")
    with pytest.raises(SandboxError, match="outside the disk budget"):
        ContainerSandbox(str(tmp_path), "localhost/x:1", 4_000_000, budget=sandbox_budget)
    with pytest.raises(TypeError, match="budget"):
        ContainerSandbox(inside, "localhost/x:1", 4_000_000)
    assert BwrapSandbox(inside, 4_000_000, BwrapConfig(), budget=sandbox_budget).budget is sandbox_budget


def test_mutation_and_unit_test_reward_sandboxes_write_inside_their_disk_budget():
    from thundersync_lightning.envs.datasets.rewards import unit_tests
    from thundersync_lightning.envs.mutations import MutationTasks

    source = MutationTasks(
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_957_000,
        uid_count=2,
        disk_bytes=8 * 1024**2,
        disk_inodes=200,
    )
    env = source.make_env(source.tasks(0, 1, 0)[0], seed=0)
    try:
        env.reset()
        assert os.path.ismount(env._dir)
        # Before: the workspace was a plain host directory; 5 x 4 MB (each under the fsize limit) all landed.
        filled = env._box.run(
            "for i in 1 2 3 4 5; do head -c 4000000 /dev/zero > f$i || echo full; done; "
            "for i in $(seq 400); do : > n$i 2>/dev/null || { echo no-inode; break; }; done"
        )
        assert "No space left on device" in filled.text and "no-inode" in filled.text
        directory = env._dir
    finally:
        env.close()
    assert not os.path.exists(directory)
    # The dataset reward's sandbox: 5 x 20 MB (under the 64 MiB fsize limit each) do not all fit.
    writer = "import os\nfor i in range(5):\n    open(f'f{i}', 'wb').write(bytes(20_000_000))\n"
    assert (
        unit_tests(
            "",
            writer,
            tests="assert sum(os.path.getsize(f'f{i}') for i in range(5)) == 10**8",
            uid_base=3_957_100,
            uid_count=1,
        )
        == 0.0
    )
    assert unit_tests("", "x = 1", tests="assert x == 1", uid_base=3_957_100, uid_count=1) == 1.0


def test_the_mutation_verdict_never_writes_through_a_link_the_agent_left(tmp_path):
    from thundersync_lightning.envs.mutations import MutationTasks

    victim = tmp_path / "victim"
    victim.write_text("keep")
    source = MutationTasks(sandbox_root="/tmp/thundersync-test-sandboxes", uid_base=3_957_000, uid_count=2)
    task = source.tasks(0, 1, 0)[0]
    env = source.make_env(task, seed=0)
    try:
        env.reset()
        # Before: the host (root) opened test_hidden.py for writing and followed the agent's link.
        env._box.run(f"ln -s {victim} test_hidden.py")
        env._current = task.candidates[0]
        env.outcome()  # the hidden script goes on stdin: the verdict writes no file at all
        assert os.path.islink(os.path.join(env._dir, "test_hidden.py"))
    finally:
        env.close()
    assert victim.read_text() == "keep"


def test_a_workspace_left_by_a_killed_learner_is_swept_when_its_uid_is_reused():
    from thundersync_lightning.envs.code import LocalCodeTasks

    source = LocalCodeTasks(
        names=["leap_year"], sandbox_root="/tmp/thundersync-test-sandboxes", uid_base=3_956_000, uid_count=1
    )
    dead = source.make_env(source.all_tasks[0], seed=0)
    dead.reset()
    stale, uid = dead.workspace._dir, dead.workspace._lease.uid
    dead.workspace._lease.release()  # what the kernel does to the lease's flock when its holder is killed
    dead.workspace._lease = None
    fresh = source.make_env(source.all_tasks[0], seed=0)
    try:
        fresh.reset()
        assert fresh.workspace._lease.uid == uid
        assert not os.path.exists(stale)
        with open("/proc/self/mounts") as f:
            assert f" {stale} " not in f.read()  # its tmpfs (and the RAM it held) is gone too
    finally:
        fresh.close()
        dead.close()  # closing what is already gone does not raise
