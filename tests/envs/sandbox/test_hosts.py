"""Sandbox hosts: podman services on other machines, reached by URL, each with a capacity.

The first tests run everywhere against a fake ``podman`` whose service "answers" while a file says
so: leasing (least loaded, capacity, waiting, a host that is down), and the rule that only a
service that stops answering turns a failed command into a :class:`HostFault` (agent code's own
``exit 125`` does not). The ``container`` tests (``make test-containers``) start real podman
services on unix sockets as stand-ins for sandbox hosts: a disk budget enforced there, two hosts
sharing episodes by capacity, and a service killed mid-episode ending its episodes as host faults
while the step completes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest

from thundersync_lightning.core.errors import ConfigError, HostFault
from thundersync_lightning.envs.sandbox import hosts as hosts_module
from thundersync_lightning.envs.sandbox.container import ContainerConfig, ContainerSandbox
from thundersync_lightning.envs.sandbox.hosts import ContainerHost, HostPool, parse_hosts


@pytest.fixture(autouse=True)
def _no_down_marks():
    hosts_module._down.clear()
    yield
    hosts_module._down.clear()


@pytest.fixture
def fake_service(tmp_path):
    """A fake ``podman``: ``--url U version`` answers while ``up/<U's host part>`` exists; ``run``
    prints and exits with ``run_status``; everything else succeeds."""
    up = tmp_path / "up"
    up.mkdir()
    path = tmp_path / "bin" / "podman"
    path.parent.mkdir()
    path.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable} -S
        import os, sys
        args = sys.argv[1:]
        url = args[args.index("--url") + 1] if "--url" in args else ""
        key = os.path.join({str(up)!r}, url.rsplit("/", 1)[-1])
        sub = next(a for a in args if not a.startswith("-") and a != url)
        if sub == "version":
            if os.path.exists(key):
                print("4.3.1")
                sys.exit(0)
            print("Error: unable to connect to Podman socket", file=sys.stderr)
            sys.exit(125)
        if sub == "run":
            print("ran")
            sys.exit(int(open({str(tmp_path / "run_status")!r}).read()))
        """)
    )
    path.chmod(0o755)
    (tmp_path / "run_status").write_text("0")

    def set_up(url: str, is_up: bool = True) -> None:
        key = up / url.rsplit("/", 1)[-1]
        key.touch() if is_up else key.unlink(missing_ok=True)

    return SimpleNamespace(engine=str(path), set_up=set_up, status=tmp_path / "run_status")


A, B = "unix:///run/host-a.sock", "unix:///run/host-b.sock"


def test_hosts_from_a_config_are_checked_at_the_boundary():
    assert parse_hosts([A, {"url": B, "capacity": 2}]) == (ContainerHost(A), ContainerHost(B, 2))
    with pytest.raises(ConfigError, match="unix://, ssh:// or tcp://"):
        parse_hosts(["http://a:8080"])
    with pytest.raises(ConfigError, match="capacity=0"):
        parse_hosts([{"url": A, "capacity": 0}])
    with pytest.raises(ConfigError, match="listed twice"):
        parse_hosts([A, {"url": A}])
    with pytest.raises(ConfigError, match="capacity='8' must be a whole number"):
        parse_hosts([{"url": A, "capacity": "8"}])
    with pytest.raises(ConfigError, match=r"keys \['capacity', 'host'\]"):
        parse_hosts([{"host": A, "capacity": 1}])
    with pytest.raises(ConfigError, match="must start with"):
        ContainerConfig(url="a.example:22")
    with pytest.raises(ConfigError, match="engine='docker'"):
        ContainerConfig(engine="docker", url=A)


def test_a_swebench_source_refuses_sandbox_hosts_it_cannot_reach(tmp_path):
    from thundersync_lightning.envs.swebench import SWEbenchTasks

    with pytest.raises(ConfigError, match="engine='docker'"):
        SWEbenchTasks(instances=str(tmp_path / "x.jsonl"), engine="docker", sandbox_hosts=[A])
    with pytest.raises(ConfigError, match="sandbox host url"):
        SWEbenchTasks(instances=str(tmp_path / "x.jsonl"), sandbox_hosts=["ftp://x"])


def test_leases_go_to_the_least_loaded_host_and_never_past_its_capacity(fake_service):
    fake_service.set_up(A)
    fake_service.set_up(B)
    pool = HostPool(fake_service.engine, (ContainerHost(A, 1), ContainerHost(B, 2)))
    leases = [pool.acquire(wait_s=0.0) for _ in range(3)]
    assert [lease.host.url for lease in leases] == [A, B, B]  # A first (both empty), then B has room
    with pytest.raises(HostFault, match=r"stayed full .* 1/1, .* 2/2"):
        pool.acquire(wait_s=0.0)
    leases[0].release()
    leases[0].release()  # a second release does nothing: the count never drifts
    assert (pool.used(A), pool.used(B)) == (0, 2)


def test_a_waiting_lease_gets_the_slot_another_releases(fake_service, monkeypatch):
    monkeypatch.setattr(hosts_module, "DOWN_S", 3600.0)  # no periodic re-check: only the release can wake it
    fake_service.set_up(A)
    pool = HostPool(fake_service.engine, (ContainerHost(A, 1),))
    first = pool.acquire(wait_s=0.0)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(wait_s=3600.0)))
    waiter.start()
    deadline = time.monotonic() + 60
    while not pool._cond._waiters:  # type: ignore[attr-defined]  # the waiter sleeps on the pool (polled)
        assert time.monotonic() < deadline and waiter.is_alive()
        time.sleep(0.01)
    first.release()
    waiter.join(60)
    assert got and got[0].host.url == A and pool.used(A) == 1


def test_a_host_that_does_not_answer_is_skipped_and_its_reason_named(fake_service):
    fake_service.set_up(B)
    pool = HostPool(fake_service.engine, (ContainerHost(A, 4), ContainerHost(B, 4)))
    assert {pool.acquire(wait_s=0.0).host.url for _ in range(3)} == {B}  # A failed its probe: marked down
    assert pool.used(A) == 0
    fake_service.set_up(B, False)
    hosts_module._down.pop(B, None)
    with pytest.raises(
        HostFault, match=r"every sandbox host is down: .*host-a.sock: Error: unable to connect"
    ):
        pool.acquire(wait_s=0.0)


@pytest.mark.parametrize("service_up", [True, False])
def test_only_a_service_that_stopped_answering_makes_a_failed_command_a_host_fault(
    fake_service, tmp_path, service_up
):
    fake_service.set_up(A, service_up)
    fake_service.status.write_text("125")  # what the remote client exits with when the service is gone
    config = ContainerConfig(engine=fake_service.engine, url=A)
    box = ContainerSandbox(SimpleNamespace(name="tsl-vol-1-1-ab"), "img", 4_000_000, config)
    argv = box.argv("true", "tsl-1-1-ab", 5.0)
    assert argv[1:3] == ["--url", A] and "--runtime" not in argv
    assert "tsl-vol-1-1-ab:/testbed:rw" in argv
    if service_up:  # agent code may `exit 125` itself: that is its command's result
        result = box.run("exit 125")
        assert result.exit_code == 125 and not result.ok
    else:
        with pytest.raises(HostFault, match=f"sandbox host {A} went away"):
            box.run("true")
        with pytest.raises(HostFault, match="every sandbox host is down"):
            HostPool(fake_service.engine, (ContainerHost(A),)).acquire(wait_s=0.0)


def test_files_cross_to_a_sandbox_host_as_root_owned_tar_and_come_back_regular_files_only():
    import io
    import tarfile

    from thundersync_lightning.envs.sandbox.volumes import pack_files, unpack_files

    data = pack_files([("eval.sh", b"echo hi\n", 0o644), ("x.py", b"print(1)", 0o600)])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert [(m.name, m.uid, m.gid, m.mode) for m in tar] == [
            ("eval.sh", 0, 0, 0o644),
            ("x.py", 0, 0, 0o600),
        ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:  # what `tar -c` in a set-up container may send
        for name, kind in (("a.py", tarfile.REGTYPE), ("link.py", tarfile.SYMTYPE), ("d", tarfile.DIRTYPE)):
            info = tarfile.TarInfo(f"./{name}" if name == "a.py" else name)
            info.type = kind
            payload = b"x" * 100 if kind == tarfile.REGTYPE else b""
            info.size, info.linkname = len(payload), "/etc/passwd" if kind == tarfile.SYMTYPE else ""
            tar.addfile(info, io.BytesIO(payload))
    stream = buf.getvalue()
    wanted = ["a.py", "link.py", "d", "absent.py"]
    assert unpack_files(stream, wanted, 10) == {
        "a.py": b"x" * 10,
        "link.py": None,
        "d": None,
        "absent.py": None,
    }
    assert unpack_files(stream[:700], wanted, 1000)["a.py"] in (
        None,
        b"x" * 100,
    )  # a cut stream: what it holds
    assert unpack_files(b"not a tar", wanted, 10) == dict.fromkeys(wanted)


# ---------------------------------------------------------------- with podman (make test-containers)

IMAGE_NOTE = "needs podman and the local test image (make test-containers)"


@pytest.fixture
def services():
    """Podman services on unix sockets (sandbox hosts' stand-ins), closed after the test."""
    from thundersync_lightning.envs.sandbox import find_engine, image_exists

    from ..podman_service import PodmanService
    from ..swebench.test_swebench_env import BASE_IMAGE

    engine = find_engine("podman")
    if engine is None or not image_exists(BASE_IMAGE, engine):
        pytest.skip(IMAGE_NOTE)
    started: list[PodmanService] = []

    def start() -> PodmanService:
        started.append(PodmanService(engine))
        return started[-1]

    yield start
    from thundersync_lightning.envs.sandbox.reaper import owner_labels

    for service in started:
        service.close()
    if started:
        started[0].remove(owner_labels()[-1])  # what a killed service left (same storage)


def _source(tmp_path, hosts, **kw):
    from thundersync_lightning.envs.swebench import SWEbenchTasks

    from ..swebench.test_swebench_env import TASK, swebench_row, write_jsonl

    image, base = kw.pop("image")
    path = write_jsonl([swebench_row(TASK, image=image, base_commit=base)], str(tmp_path))
    return SWEbenchTasks(
        instances=path,
        engine="podman",
        memory="1g",
        nproc=256,
        eval_timeout_s=300,
        uid_base=3_970_100,
        uid_count=32,
        sandbox_hosts=hosts,
        **kw,
    )


@pytest.mark.container
def test_on_a_sandbox_host_the_disk_budget_holds_and_episodes_share_hosts_by_capacity(
    services, instance_image, tmp_path
):
    one, two = services(), services()
    source = _source(
        tmp_path,
        [{"url": one.url, "capacity": 1}, {"url": two.url, "capacity": 1}],
        image=instance_image,
        disk_bytes=8 * 1024**2,
        disk_inodes=2000,
        host_wait_s=0.0,
    )
    task = source.tasks(0, 1, 0)[0]
    envs = [source.make_env(task, 0) for _ in range(3)]
    try:
        envs[0].reset()
        envs[1].reset()
        assert {envs[0].workspace.host, envs[1].workspace.host} == {one.url, two.url}
        with pytest.raises(HostFault, match="stayed full"):
            envs[2].reset()
        full = envs[0].workspace.run(
            "head -c 20000000 /dev/zero > big; echo status=$?; "
            "for i in $(seq 3000); do : > f$i || break; done; ls | wc -l"
        )
        assert "No space left on device" in full.text and "status=1" in full.text
        assert int(full.text.split()[-1]) < 2000  # the inode budget too
        # a verdict's fresh tree on the host: the graded files read back as the image holds them
        trees = envs[1].workspace._trees
        tree = trees.fresh()
        try:
            got = trees.read(tree, {"intervals.py", "missing.py", "tests", "../etc/passwd"})
        finally:
            trees.remove(tree)
        image, _ = instance_image
        original = subprocess.run(
            [
                "podman",
                "run",
                "--rm",
                "--pull=never",
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
                image,
                "cat",
                "/testbed/intervals.py",
            ],
            capture_output=True,
            check=True,
        ).stdout
        assert got == {"intervals.py": original, "missing.py": None, "tests": None, "../etc/passwd": None}
    finally:
        for env in envs:
            env.close()


@pytest.mark.container
def test_a_sandbox_host_killed_mid_episode_ends_its_episodes_as_host_faults_and_the_step_completes(
    services, instance_image, tmp_path
):
    from thundersync_lightning.envs.codec import ByteCodec
    from thundersync_lightning.envs.sandbox import find_engine
    from thundersync_lightning.envs.sandbox.reaper import owner_labels
    from thundersync_lightning.rollout import AgentLoop, EnvPool, Generation, make_request

    from ...rollout.helpers import collect

    service = services()
    source = _source(
        tmp_path,
        [{"url": service.url, "capacity": 4}],
        image=instance_image,
        command_timeout_s=120,
        max_turns=3,
    )
    action = ByteCodec().encode("bash sleep 100") + (ByteCodec.END_OF_ACTION,)

    def policy(requests):
        return [
            Generation(tuple(action[: r.max_new_tokens]), (0.0,) * min(len(action), r.max_new_tokens))
            for r in requests
        ]

    engine = find_engine("podman")
    label = owner_labels()[-1]

    def kill_when_sleeping() -> None:  # the service dies while both commands run (podman's own state, polled)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ps = subprocess.run(
                [
                    engine,
                    "--runtime",
                    "/usr/sbin/runc",
                    "ps",
                    "--filter",
                    f"label={label}",
                    "--format",
                    "{{.Names}} {{.Command}}",
                ],
                capture_output=True,
                text=True,
            ).stdout
            if sum("sleep 100" in line for line in ps.splitlines()) == 2:
                break
            time.sleep(0.2)
        service.kill()

    killer = threading.Thread(target=kill_when_sleeping)
    pool = EnvPool(4)
    events: list = []
    try:
        loop = AgentLoop(source, policy, pool, step_timeout_s=300)
        killer.start()
        done = loop.run(make_request(source, 0, 1, 2, 0), 0, events.append)
        assert done.wait(timeout=200), "the step's rollouts did not finish"
    finally:
        killer.join(150)
        pool.shutdown()
    trajectories, rewards, _ = collect(events)
    assert len(rewards) == 2
    for reward in rewards.values():
        assert reward.reward == 0.0 and reward.host_fault
        assert f"sandbox host {service.url} went away" in reward.failure
    assert all(t.finish_reason == "failure" for t in trajectories.values())


def test_the_scaling_docs_sandbox_host_config_builds_a_task_source(tmp_path):
    """docs/scaling.md's sandbox-host YAML, as the CLI would pass it (class path and init_args)."""
    import importlib
    import pathlib
    import re

    import yaml

    doc = (pathlib.Path(__file__).parents[3] / "docs" / "scaling.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "sandbox_hosts" in b]
    spec = yaml.safe_load(block)["data"]["tasks"]
    module, name = spec["class_path"].rsplit(".", 1)
    args = dict(spec["init_args"], instances=str(tmp_path / "instances.jsonl"))
    source = getattr(importlib.import_module(module), name)(**args)
    assert [(h.url, h.capacity) for h in source.settings.hosts] == [
        ("ssh://root@sandbox-0/run/podman/podman.sock", 32),
        ("ssh://root@sandbox-1/run/podman/podman.sock", 32),
    ]
    assert source.settings.host_wait_s == 600


def test_a_workspace_closed_while_it_opens_frees_its_host_slot_uid_and_trees(
    fake_service, monkeypatch, tmp_path
):
    """An abandoned reset (the loop's step timeout) closes the workspace from another thread while
    open() still runs: what open() took after that close is freed by open() itself."""
    from thundersync_lightning.envs.sandbox import container as container_module
    from thundersync_lightning.envs.sandbox.base import SandboxError
    from thundersync_lightning.envs.swebench import workspace as workspace_module
    from thundersync_lightning.envs.swebench.workspace import SWEbenchSettings, SWEbenchWorkspace

    from .._support import TEST_POOL
    from ..swebench.test_swebench_env import TASK, load_instances, swebench_row, write_jsonl

    fake_service.set_up(A)
    for module in (container_module, workspace_module):
        monkeypatch.setattr(module, "find_engine", lambda engine="auto": fake_service.engine)
    closed: list[str] = []

    class Trees:
        agent, agent_budget = SimpleNamespace(name="tsl-vol-1-1-ab"), None

        def __init__(self, *args, **kwargs):
            pass

        def open(self, base):
            ws.close()  # the loop gave up on this reset meanwhile
            return base

        def close(self):
            closed.append("trees")

    monkeypatch.setattr(workspace_module, "VolumeTrees", Trees)
    (instance,) = load_instances(
        write_jsonl([swebench_row(TASK, image="localhost/x:1", base_commit="HEAD")], str(tmp_path))
    )
    hosts = (ContainerHost(A, 1),)
    ws = SWEbenchWorkspace(instance, SWEbenchSettings(hosts=hosts), TEST_POOL)
    with pytest.raises(SandboxError, match="closed while it was opening"):
        ws.open()
    assert closed and set(closed) == {"trees"}  # closed (twice is harmless: trees free once)
    pool = hosts_module.host_pool(fake_service.engine, hosts)
    assert pool.used(A) == 0  # the slot is free again
    lease = TEST_POOL.acquire()  # and the uid pool is not short of the workspace's uid
    lease.release()


@pytest.mark.container
def test_a_sandbox_host_that_hangs_fails_the_command_as_a_host_fault_within_its_deadline(
    services, instance_image, tmp_path
):
    """A stopped service answers nothing: the client is killed at the command's deadline (+15 s),
    the probe gives up after 10 s, and the command raises HostFault; no wait is unbounded."""
    service = services()
    source = _source(tmp_path, [{"url": service.url, "capacity": 1}], image=instance_image)
    env = source.make_env(source.tasks(0, 1, 0)[0], 0)
    try:
        env.reset()
        assert env.workspace.run("echo up", timeout_s=10).text.strip() == "up"
        service.pause()
        outcome: list = []
        runner = threading.Thread(
            target=lambda: outcome.append(_raised(env.workspace.run, "true", timeout_s=2))
        )
        runner.start()
        runner.join(2 + 15 + hosts_module.PROBE_S + 30)  # the deadlines, and room for a loaded machine
        assert not runner.is_alive(), "the command outlived its deadlines on a hung host"
        assert isinstance(outcome[0], HostFault) and f"sandbox host {service.url} went away" in str(
            outcome[0]
        )
    finally:
        service.pause(False)
        env.close()


def _raised(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc


def test_container_host_in_the_environment_is_a_sandbox_host_as_podman_reads_it(monkeypatch):
    monkeypatch.setenv("CONTAINER_HOST", B)
    config = ContainerConfig(engine="podman")
    assert config.url == B and ContainerConfig(url=A).url == A  # an explicit URL wins
    assert ContainerConfig(engine="docker").url is None  # docker reads DOCKER_HOST, not this
    from thundersync_lightning.envs.sandbox.container import global_args

    assert global_args("/usr/bin/podman", config) == ["--url", B]  # no --runtime: the service's applies
    monkeypatch.setenv("CONTAINER_HOST", "host-b:22")
    with pytest.raises(ConfigError, match="must start with"):
        ContainerConfig()
