"""SWE-bench-schema instances graded through swebench's own code from real test runs.

Without a container engine the instance's eval script runs in bubblewrap (its /testbed is the
sandbox workdir); with podman (``make test-containers``) the whole environment runs in a locally
built image. No verdict is ever faked: where neither can run, the tests skip.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.envs.code import load_tasks
from thundersync_lightning.envs.codec import ByteCodec
from thundersync_lightning.envs.repo.grading import grade_with_spec
from thundersync_lightning.envs.sandbox import (
    BwrapConfig,
    BwrapSandbox,
    SandboxLimits,
    chown_tree,
    find_engine,
)
from thundersync_lightning.envs.swebench.source import SWEbenchTasks, load_instances

from .._support import TEST_POOL, git_repo, needs_bwrap, swebench_row
from ..conftest import SWE_BASE_IMAGE, SWE_TASK

TASK = load_tasks(names=[SWE_TASK])[0]
BASE_IMAGE = SWE_BASE_IMAGE
CODEC = ByteCodec()


def write_jsonl(rows: list[dict], directory: str) -> str:
    path = os.path.join(directory, "instances.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


@needs_bwrap
@pytest.mark.parametrize("apply_gold", [True, False])
def test_a_swebench_instance_is_graded_by_make_test_spec_and_get_eval_report_from_a_real_run(
    tmp_path, sandbox_dir, sandbox_budget, apply_gold
):
    from swebench.harness.utils import make_test_spec

    lease = TEST_POOL.acquire()
    try:
        repo = os.path.join(sandbox_dir, "testbed")
        os.mkdir(repo)
        base = git_repo(TASK, repo)
        row = swebench_row(TASK, image="unused-in-bwrap", base_commit=base)
        (instance,) = load_instances(write_jsonl([row], str(tmp_path)))
        spec = make_test_spec(instance)
        chown_tree(repo, lease.uid)
        box = BwrapSandbox(
            repo,
            lease.uid,
            BwrapConfig(SandboxLimits(timeout_s=60, max_output_bytes=1 << 20)),
            budget=sandbox_budget,
        )
        if apply_gold:
            assert box.run("git apply -", stdin=TASK.gold_patch.encode()).exit_code == 0
        run = box.run(spec.eval_script)
        assert run.exit_code == 0
        outcome = grade_with_spec(spec, run.text, TASK.gold_patch if apply_gold else "")
        status = outcome.report["tests_status"]
        assert outcome.resolved is apply_gold
        if apply_gold:
            assert status["FAIL_TO_PASS"]["success"] == list(TASK.fail_to_pass)
        else:
            assert status["FAIL_TO_PASS"]["failure"] == list(TASK.fail_to_pass)
        assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(TASK.pass_to_pass)
    finally:
        lease.release()


# Appended to the module under test: on import it prints what it can find of the run's secrets and
# a PASSED line for every graded test onto every pipe it holds (the real output), then exits 0
# before pytest reports anything.
FORGE = """
import os as _os


def _forge(names):
    found = [repr(dict(_os.environ)), "/proc/self/cmdline"]
    for path in ("/tsl-eval/eval.sh", f"/proc/{_os.getppid()}/environ", f"/proc/{_os.getppid()}/cmdline"):
        try:
            found.append(open(path, "rb").read().decode("latin-1"))
        except OSError as e:
            found.append(str(e))
    text = "\\n".join(["LEAKS", *found, *(f"PASSED {n}" for n in names)]) + "\\n"
    for fd in range(3, 256):
        try:
            if _os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                _os.write(fd, text.encode())
        except OSError:
            pass
    _os._exit(0)


_forge(%r)
"""


# Appended to the module under test: reads the memory of every ancestor it can (the eval shell holds
# the run's key and marker tags) and writes every 64-hex-digit string found onto every pipe it holds.
PEEK = """
import os as _os
import re as _re


def _peek():
    found, pid = set(), _os.getppid()
    while pid >= 1:  # in a container the eval shell is pid 1
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
                for line in maps:
                    span, perms = line.split()[:2]
                    start, end = (int(x, 16) for x in span.split("-"))
                    if "r" in perms and "w" in perms:
                        try:
                            mem.seek(start)
                            found.update(_re.findall(rb"(?:tsl-)?[0-9a-f]{24,64}",
                                                     mem.read(min(end - start, 1 << 24))))
                        except OSError:
                            pass
        except OSError as e:
            found.add(f"{pid}: {e}".encode())
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    text = b"PEEKED " + b" ".join(sorted(found)[:2000]) + b"\\n"
    for fd in range(3, 256):
        try:
            if _os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                _os.write(fd, text)
        except OSError:
            pass


_peek()
"""


# Appended to the module under test: marks the hidden test as an expected failure that never runs.
XFAIL_ITSELF = """
import gc as _gc

import pytest as _pytest


class _Marker:
    def pytest_collection_modifyitems(self, items):
        for item in items:
            if item.nodeid.endswith(%r):
                item.add_marker(_pytest.mark.xfail(run=False, reason="hack"))


for _o in _gc.get_objects():
    if type(_o).__name__ == "Config" and hasattr(_o, "pluginmanager"):
        _o.pluginmanager.register(_Marker(), "tsl-hack")
        break
"""


# The agent's setup.py, run by the eval script's install step (SWE-bench's `pip install -e .`): it
# plants an import line in the user site directory, the one place on start-up's path the step can
# write to in a read-only image. Python runs it at the test process's start, before any plugin.
SETUP_PLANTS_PTH = """
import os, site
d = site.getusersitepackages()
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "tsl_plant.pth"), "w") as f:
    f.write("import os; fd = os.environ.get('TSL_REPORT_FD'); "
            "os.write(1, b'PLANT-RAN ' + (os.read(int(fd), 400) if fd else b'after-the-key') + b'\\\\n')\\n")
with open(os.path.join(d, "usercustomize.py"), "w") as f:
    f.write("import os\\nos.write(1, b'USERCUSTOMIZE-RAN ' + "
            "os.environ.get('TSL_REPORT_FD', 'after-the-key').encode() + b'\\\\n')\\n")
"""


@needs_bwrap
@pytest.mark.parametrize("variant", ["gold", "unfixed", "forged", "xfail", "peek", "install"])
def test_the_container_eval_run_in_bubblewrap_grades_from_the_reporter_and_shows_no_key(
    tmp_path, sandbox_dir, sandbox_budget, variant
):
    """The container path's eval run (read-only script directory, key on stdin only, reporter
    plugin) run by bubblewrap instead of podman: the same command, script and grading."""
    from swebench.harness.utils import make_test_spec

    from thundersync_lightning.envs.repo.grading import grade_with_spec
    from thundersync_lightning.envs.swebench.eval_run import (
        EVAL_DIR,
        EvalSecrets,
        eval_command,
        grade_eval_run,
        write_eval_dir,
    )

    lease = TEST_POOL.acquire()
    try:
        repo = os.path.join(sandbox_dir, "testbed")
        os.mkdir(repo)
        base = git_repo(TASK, repo)
        (instance,) = load_instances(
            write_jsonl([swebench_row(TASK, image="unused", base_commit=base)], str(tmp_path))
        )
        spec = make_test_spec(instance)
        if variant == "forged":
            with open(os.path.join(repo, "intervals.py"), "a") as f:
                f.write(FORGE % (list(TASK.fail_to_pass + TASK.pass_to_pass),))
        if variant == "peek":
            with open(os.path.join(repo, "intervals.py"), "a") as f:
                f.write(PEEK)
        if variant == "xfail":
            with open(os.path.join(repo, "intervals.py"), "a") as f:
                f.write(XFAIL_ITSELF % (TASK.fail_to_pass[0].split("::", 1)[1],))
        script = spec.eval_script
        if variant == "install":
            with open(os.path.join(repo, "setup.py"), "w") as f:
                f.write(SETUP_PLANTS_PTH)
            start = ": '>>>>> Start Test Output'"
            script = script.replace(start, f"python3 setup.py\n{start}")
        chown_tree(repo, lease.uid)
        scripts = os.path.join(sandbox_dir, "eval")
        write_eval_dir(scripts, script, spec.log_parser, "/bin/bash")
        box = BwrapSandbox(
            repo,
            lease.uid,
            BwrapConfig(SandboxLimits(timeout_s=60, max_output_bytes=1 << 20)),
            budget=sandbox_budget,
            ro_binds={scripts: EVAL_DIR},
        )
        if variant == "gold":
            assert box.run("git apply -", stdin=TASK.gold_patch.encode()).exit_code == 0
        if variant == "forged":  # before: graded from the log, the forged lines resolve the instance
            assert grade_with_spec(spec, box.run(spec.eval_script).text, "x").resolved
        secrets = EvalSecrets.new()
        result = box.run(eval_command(), stdin=secrets.stdin())
        outcome = grade_eval_run(spec, result, secrets, TASK.gold_patch, declared=dict(TASK.files))
    finally:
        lease.release()
    assert secrets.key not in result.text  # not in the script, the environment, any argv or the output
    assert outcome.resolved is (variant == "gold")
    if variant == "forged":
        assert "LEAKS" in result.text and "no trustworthy test results" in outcome.reason
    elif variant == "peek":  # before: the eval shell's memory (the key, the tags) was read through /proc
        peeked = "".join(line for line in result.text.splitlines() if line.startswith("PEEKED"))
        assert "Permission denied" in peeked  # the ancestors' memory is closed, nothing of it was read
        assert not any(t in peeked for t in secrets.stdin().decode().split())
    elif variant == "install":  # before: the planted line ran first and read the key from its pipe
        assert "PLANT-RAN after-the-key" in result.text  # it still runs, as test code, once the key is gone
        assert (
            "USERCUSTOMIZE-RAN" not in result.text
        )  # the eval directory's empty usercustomize is found first
        assert outcome.report["tests_status"]["FAIL_TO_PASS"]["failure"] == list(TASK.fail_to_pass)
    elif variant == "xfail":  # before: swebench counted the signed XFAIL as a pass
        assert outcome.report["tests_status"]["FAIL_TO_PASS"]["success"] == list(TASK.fail_to_pass)
        assert f"{TASK.fail_to_pass[0]}: XFAIL at run time" in outcome.reason
    else:
        status = outcome.report["tests_status"]
        assert status["FAIL_TO_PASS"]["success" if variant == "gold" else "failure"] == list(
            TASK.fail_to_pass
        )
        assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(TASK.pass_to_pass)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (workspace uids)")
@pytest.mark.parametrize("signed", [True, False])
def test_the_container_eval_run_gets_a_read_only_script_and_its_key_on_stdin_only(
    tmp_path, sandbox_dir, monkeypatch, signed
):
    """SWEbenchWorkspace.evaluate against a stand-in for the container runs: what each run gets
    (argv, mounts, stdin, the script directory's files) and how its output is graded."""
    from thundersync_lightning.envs.repo.pytest_config import manifest_command
    from thundersync_lightning.envs.repo.reporter import signed_lines
    from thundersync_lightning.envs.sandbox import SandboxResult
    from thundersync_lightning.envs.sandbox import container as container_module
    from thundersync_lightning.envs.swebench import trees as trees_module
    from thundersync_lightning.envs.swebench.eval_run import EVAL_DIR, SHELL_NAME, EvalSecrets, eval_command
    from thundersync_lightning.envs.swebench.workspace import SWEbenchSettings, SWEbenchWorkspace

    MANIFEST = f"{'0' * 64}  /testbed/conftest.py\n"

    monkeypatch.setattr(container_module, "find_engine", lambda engine="auto": "/usr/bin/podman")
    monkeypatch.setattr(
        trees_module,
        "copy_from_image",
        lambda image, src, dest, config=None: (
            shutil.copyfile("/bin/bash", dest) if src == "/bin/bash" else git_repo(TASK, dest)
        ),
    )
    runs = []
    nodes = list(TASK.fail_to_pass + TASK.pass_to_pass)

    def run(box, command, *, stdin=None, timeout_s=None):
        argv = box.argv(command, "tsl-test", 10.0)
        mounts = {argv[i + 1] for i, a in enumerate(argv) if a == "-v"}
        files = {}
        for spec in mounts:
            host, inside, _ = spec.split(":")
            if inside == EVAL_DIR:
                files = {
                    n: (os.stat(os.path.join(host, n)), open(os.path.join(host, n), "rb").read())
                    for n in os.listdir(host)
                }
                files[""] = (os.stat(host), b"")
        runs.append((argv, mounts, stdin, files))
        if command == manifest_command():  # the original tree's pytest configuration
            return SandboxResult(0, MANIFEST.encode())
        if command != eval_command():
            return SandboxResult(0, b"applied\n")
        key = stdin.decode().split()[0]
        tag = EvalSecrets(key).config_tag  # the eval shell's manifest before the tests: unchanged
        lines = [f"{tag} {line}" for line in MANIFEST.splitlines()] + [f"{tag} end"]
        lines += (
            [f"PASSED {n}" for n in nodes]
            if not signed
            else signed_lines(key, [("PASSED", n) for n in nodes] + [("END", f"{len(nodes)} 0")])
        )
        return SandboxResult(0, ("\n".join(lines) + "\n").encode())

    monkeypatch.setattr(container_module.ContainerSandbox, "run", run)
    (instance,) = load_instances(
        write_jsonl([swebench_row(TASK, image="localhost/x:1", base_commit="HEAD")], str(tmp_path))
    )
    ws = SWEbenchWorkspace(instance, SWEbenchSettings(root=os.path.join(sandbox_dir, "ws")), TEST_POOL)
    try:
        ws.open()
        outcome = ws.evaluate(TASK.gold_patch)
    finally:
        ws.close()
    assert outcome.resolved is signed  # unsigned PASSED lines are just text
    argv, mounts, stdin, files = runs[-1]
    key = stdin.decode().split()[0]
    (scripts,) = [m for m in mounts if f":{EVAL_DIR}:" in m]
    assert scripts.endswith(f":{EVAL_DIR}:ro") and argv[-1] == eval_command()
    assert not any(key in a for a in argv)
    plugin = [n for n in files if n.startswith("tsl_report_")]
    assert sorted(files) == sorted(
        ["", "eval.sh", SHELL_NAME, "sitecustomize.py", "usercustomize.py", *plugin]
    )
    assert len(plugin) == 1
    for name, (st, text) in files.items():
        assert st.st_uid == 0 and st.st_mode & 0o022 == 0 and key.encode() not in text, name
    assert files[SHELL_NAME][0].st_mode & 0o777 == 0o711  # execute only: its process is not dumpable
    assert f"__tsl_test_start {plugin[0][:-3]}".encode() in files["eval.sh"][1]
    assert all(EVAL_DIR not in " ".join(a) for a, *_ in runs[:-1])  # only the eval run sees it


def test_the_declared_markers_of_a_swebench_instance_come_from_the_image_with_its_test_patch(tmp_path):
    import difflib

    from thundersync_lightning.envs.swebench.workspace import SWEbenchSettings, SWEbenchWorkspace

    testbed = str(tmp_path / "testbed")
    git_repo(TASK, testbed)
    rel = TASK.test_files[0]
    name = TASK.fail_to_pass[0].split("::")[-1]
    before = open(os.path.join(testbed, rel)).read()
    after = before.replace(f"def {name}(", f"@pytest.mark.xfail(reason='upstream')\ndef {name}(")
    assert after != before
    test_patch = "".join(
        difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}")
    )
    row = dict(swebench_row(TASK, image="unused", base_commit="HEAD"), test_patch=test_patch)
    (instance,) = load_instances(write_jsonl([row], str(tmp_path)))
    from swebench.harness.utils import make_test_spec

    from thundersync_lightning.envs.swebench.trees import HostTrees, Tree

    ws = SWEbenchWorkspace(instance, SWEbenchSettings(), TEST_POOL)
    ws._trees = HostTrees("unused", ws.config, 0, str(tmp_path), 1, 1, False)  # where the fresh copy lies
    declared = ws._declared_sources(Tree(testbed, None, None), make_test_spec(instance))
    assert (
        declared[rel] == after and open(os.path.join(testbed, rel)).read() == before
    )  # the copy is untouched
    from thundersync_lightning.envs.repo.outcomes import declared_markers

    assert declared_markers(declared, TASK.fail_to_pass[0]) == {"xfail"}


def test_rows_without_the_fields_swebench_5_needs_are_rejected(tmp_path):
    from thundersync_lightning.core.errors import ConfigError

    row = swebench_row(TASK, image="x", base_commit="0" * 40)
    del row["eval_script"]
    with pytest.raises(ConfigError, match="eval_script"):
        load_instances(write_jsonl([row], str(tmp_path)))


# ---------------------------------------------------------------- container backend (podman)


@pytest.fixture(params=["local", "sandbox_host"])
def swebench_source(request, instance_image, tmp_path):
    """The instance on this host's engine, and on a sandbox host (a podman service reached by URL):
    every container test below holds on both."""
    tag, base = instance_image
    path = write_jsonl([swebench_row(TASK, image=tag, base_commit=base)], str(tmp_path))
    hosts = None
    if request.param == "sandbox_host":
        hosts = [{"url": request.getfixturevalue("podman_service").url, "capacity": 4}]
    return SWEbenchTasks(
        instances=path,
        engine="podman",
        command_timeout_s=60,
        eval_timeout_s=300,
        memory="1g",
        nproc=256,
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_970_000,
        uid_count=32,
        sandbox_hosts=hosts,
    )


def act(env, text):
    return CODEC.decode(env.step(CODEC.encode(text) + (ByteCodec.END_OF_ACTION,)).observation)


@pytest.mark.container
def test_in_a_container_the_gold_patch_resolves_the_instance(swebench_source):
    (task,) = swebench_source.tasks(0, 1, 0)
    env = swebench_source.make_env(task, 0)
    try:
        assert TASK.problem_statement.strip() in CODEC.decode(env.reset())
        assert "intervals.py" in act(env, "bash ls; id -u")
        obs = act(
            env, f"bash\ncat > /tmp/p <<'EOF_P'\n{TASK.gold_patch}EOF_P\ngit apply /tmp/p && echo applied"
        )
        assert "applied" in obs
        assert "unreachable" in act(
            env, "bash python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53))\""
        )
        env.step(CODEC.encode("submit"))
        assert env.verdict() == 1.0
        assert env.outcome().report["tests_status"]["FAIL_TO_PASS"]["success"] == list(TASK.fail_to_pass)
    finally:
        env.close()


@pytest.mark.container
def test_in_a_container_no_change_and_test_edits_earn_zero(swebench_source):
    (task,) = swebench_source.tasks(0, 1, 0)
    untouched = swebench_source.make_env(task, 0)
    gamed = swebench_source.make_env(task, 0)
    try:
        untouched.reset()
        assert untouched.verdict() == 0.0
        gamed.reset()
        act(
            gamed,
            "bash\nprintf '\\n\\ndef test_touching():\\n    pass\\n' >> tests/test_intervals.py\n"
            "echo '# touched' >> intervals.py",
        )
        assert gamed.verdict() == 0.0
        assert gamed.outcome().report["tests_status"]["FAIL_TO_PASS"]["failure"] == list(TASK.fail_to_pass)
    finally:
        untouched.close()
        gamed.close()


@pytest.mark.container
def test_in_a_container_code_under_test_cannot_read_the_eval_shells_memory(swebench_source, monkeypatch):
    from thundersync_lightning.envs.swebench import workspace as swebench_env

    seen = []

    def spy(spec, result, secrets, patch, declared=None, config=None):
        seen.append((result.text, secrets))
        return grade_eval_run(spec, result, secrets, patch, declared, config)

    grade_eval_run = swebench_env.grade_eval_run
    monkeypatch.setattr(swebench_env, "grade_eval_run", spy)
    (task,) = swebench_source.tasks(0, 1, 0)
    env = swebench_source.make_env(task, 0)
    try:
        env.reset()
        patch = TASK.gold_patch
        act(
            env,
            f"bash\ncat > /tmp/p <<'EOF_P'\n{patch}EOF_P\ngit apply /tmp/p && cat >> intervals.py <<'EOF_Q'\n"
            f"{PEEK}EOF_Q",
        )
        env.step(CODEC.encode("submit"))
        assert env.verdict() == 1.0  # the fix still counts; nothing was learnt from the shell
    finally:
        env.close()
    ((text, secrets),) = seen
    peeked = "".join(line for line in text.splitlines() if line.startswith("PEEKED"))
    assert "Permission denied" in peeked
    assert not any(t in peeked for t in secrets.stdin().decode().split())


@pytest.mark.container
def test_a_container_command_is_contained_and_cleaned_up(swebench_source):
    (task,) = swebench_source.tasks(0, 1, 0)
    env = swebench_source.make_env(task, 0)
    engine = find_engine("podman")
    try:
        env.reset()
        ws = env.workspace
        out = ws.run(
            "touch /usr/x 2>&1; cat /proc/self/status | grep CapEff; setsid sleep 1000 & echo bg",
            timeout_s=30,
        )
        assert "Read-only file system" in out.text and "0000000000000000" in out.text
        slow = ws.run("sleep 100", timeout_s=2)
        assert slow.timed_out
        big = ws.run("head -c 1000000000 /dev/zero")
        assert big.truncated
        bomb = ws.run("bomb() { bomb | bomb & }; bomb; sleep 2; echo after", timeout_s=10)
        assert "fork: retry" in bomb.text or "Resource temporarily unavailable" in bomb.text or bomb.timed_out
        memory = ws.run("python3 -c \"x = bytearray(3 * 1024**3); print('allocated')\"", timeout_s=60)
        assert memory.exit_code != 0 and "allocated" not in memory.text
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        try:
            port = listener.getsockname()[1]
            probe = ws.run(
                f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 5)\""
            )
            assert probe.exit_code != 0 and "Connection refused" in probe.text
        finally:
            listener.close()
        # only a sandbox host's volume holders live between commands
        assert not [n for n in ours(engine, "ps") if not n.startswith("tsl-hold-")]
    finally:
        env.close()
    assert not ours(engine, "ps") and not ours(engine, "volume")


def ours(engine: str, what: str) -> list[str]:
    """This process's containers (``ps``) or volumes (``volume``) in podman's storage."""
    from thundersync_lightning.envs.sandbox.reaper import owner_labels

    label = owner_labels()[-1]
    args = (
        ["ps", "-a", "--format", "{{.Names}}"] if what == "ps" else ["volume", "ls", "--format", "{{.Name}}"]
    )
    return subprocess.run(
        [engine, "--runtime", "/usr/sbin/runc", *args, "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


@pytest.mark.container
def test_a_missing_image_is_an_error_not_a_zero_reward(tmp_path):
    if find_engine("podman") is None:
        pytest.skip("needs podman")
    from thundersync_lightning.envs.sandbox import SandboxError

    row = swebench_row(TASK, image="localhost/thundersync-no-such-image:none", base_commit="0" * 40)
    source = SWEbenchTasks(
        instances=write_jsonl([row], str(tmp_path)),
        engine="podman",
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_970_000,
        uid_count=32,
    )
    env = source.make_env(source.tasks(0, 1, 0)[0], 0)
    with pytest.raises(SandboxError, match="no-such-image"):
        env.reset()
    env.close()


def test_containers_never_pull_get_no_host_proxy_and_have_cpu_memory_and_swap_limits(
    sandbox_budget, monkeypatch
):
    from thundersync_lightning.envs.sandbox import ContainerConfig, ContainerSandbox, SandboxLimits
    from thundersync_lightning.envs.sandbox import container as container_module

    monkeypatch.setattr(container_module, "find_engine", lambda engine="auto": "/usr/bin/podman")
    config = ContainerConfig(
        engine="podman", runtime="", memory="1g", limits=SandboxLimits(cpus=1.5, nproc=64)
    )
    box = ContainerSandbox(
        sandbox_budget.path,
        "localhost/x:y",
        4_000_000,
        config,
        ro_volumes={"/h/base.git": "/b.git"},
        budget=sandbox_budget,
    )
    argv = box.argv("true", "tsl-test", 10.0)
    flags = " ".join(argv)
    for expected in (
        "--pull=never",
        "--http-proxy=false",
        "--cpus 1.5",
        "--memory 1g",
        "--memory-swap 1g",
        "--pids-limit 64",
        "--network none",
        "--cap-drop all",
        "--read-only",
        "-v /h/base.git:/b.git:ro",
    ):
        assert expected in flags, expected
    assert argv.index("--pull=never") < argv.index("localhost/x:y")
    from thundersync_lightning.envs.sandbox.reaper import host_key, process_start

    owner = f"tsl.owner={host_key()}.{os.getpid()}.{process_start(os.getpid())}"
    assert f"--label tsl.host={host_key()}" in flags and f"--label {owner}" in flags  # what the reaper finds


@needs_bwrap
def test_the_container_paths_patch_capture_uses_a_host_copy_of_the_base_commit(
    tmp_path, sandbox_dir, sandbox_budget
):
    from thundersync_lightning.envs.repo.patches import BASE_GIT_DIR, capture_command
    from thundersync_lightning.envs.swebench.workspace import SWEbenchSettings, SWEbenchWorkspace

    repo = os.path.join(sandbox_dir, "testbed")
    os.mkdir(repo)
    base = git_repo(TASK, repo)
    (instance,) = load_instances(
        write_jsonl([swebench_row(TASK, image="unused", base_commit=base)], str(tmp_path))
    )
    from thundersync_lightning.envs.swebench.trees import HostTrees

    ws = SWEbenchWorkspace(instance, SWEbenchSettings(), TEST_POOL)
    trees = HostTrees("unused", ws.config, 0, sandbox_dir, 1, 1, False)
    trees._dir = sandbox_dir  # where open() would have copied the image's /testbed
    assert trees._base_git(repo, base) == base
    lease = TEST_POOL.acquire()
    try:
        chown_tree(repo, lease.uid)
        box = BwrapSandbox(
            repo,
            lease.uid,
            BwrapConfig(SandboxLimits(timeout_s=60)),
            budget=sandbox_budget,
            ro_binds={os.path.join(sandbox_dir, "base.git"): BASE_GIT_DIR},
        )
        # The agent's own repository config would run a filter; the capture never reads it.
        box.run(
            "git config filter.x.clean 'touch /testbed/.ran; cat' && echo '*.py filter=x' > .gitattributes "
            "&& git apply - && rm -f .ran",
            stdin=TASK.gold_patch.encode(),
        )
        patch = box.run(capture_command(base)).text
    finally:
        lease.release()
    from thundersync_lightning.envs.repo.patches import patch_paths

    added = [
        line for line in TASK.gold_patch.splitlines() if line.startswith("+") and not line.startswith("+++")
    ]
    assert added and all(line in patch.splitlines() for line in added)
    assert set(patch_paths(patch)) == {"intervals.py", ".gitattributes"}
    assert not os.path.exists(os.path.join(repo, ".ran"))
    assert ws.protects("tests/test_intervals.py") and not ws.protects("intervals.py")


def test_held_out_instances_never_train_and_are_the_validation_tasks(tmp_path):
    rows = [
        dict(swebench_row(TASK, image="unused", base_commit="0" * 40), instance_id=f"repo__x-{k}")
        for k in range(12)
    ]
    path = write_jsonl(rows, str(tmp_path))
    by_id = SWEbenchTasks(instances=path, val_instance_ids=["repo__x-3", "repo__x-7"])
    assert [r["instance_id"] for r in by_id.validation_tasks()] == ["repo__x-3", "repo__x-7"]
    trained = {r["instance_id"] for step in range(20) for r in by_id.tasks(step, 4, seed=0)}
    assert trained and not trained & {"repo__x-3", "repo__x-7"}
    by_hash = SWEbenchTasks(instances=path, val_fraction=0.3)
    held = {r["instance_id"] for r in by_hash.validation_tasks()}
    assert 0 < len(held) < 12
    assert not held & {r["instance_id"] for step in range(20) for r in by_hash.tasks(step, 4, seed=1)}
    with pytest.raises(ConfigError, match="holds out 0 of 12 instances"):
        SWEbenchTasks(instances=path).validation_tasks()
