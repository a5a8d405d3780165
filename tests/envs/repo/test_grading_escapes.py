"""Ways out of a zero through the grader, each written as an agent would: a workspace filled to its
disk budget (grading itself failed with ENOSPC, the episode was dropped as an environment failure),
a pytest configuration the graded run read from the agent's tree, start-up code and bytecode the
install step planted, and a package that shadows a graded test module."""

from __future__ import annotations

import os
import tempfile

import pytest

from thundersync_lightning.envs.code import LocalCodeTasks, LocalTask
from thundersync_lightning.envs.codec import ByteCodec
from thundersync_lightning.envs.repo.pytest_config import is_protected_path

from .._support import needs_bwrap

CODEC = ByteCodec()
FIX = (
    "replace calendar_utils.py\n<<<<<<< SEARCH\n    return year % 4 == 0 and year % 100 != 0\n=======\n"
    "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n>>>>>>> REPLACE"
)


def act(env, text: str):  # noqa: ANN001, ANN201
    return CODEC.decode(env.step(CODEC.encode(text) + (ByteCodec.END_OF_ACTION,)).observation)


@needs_bwrap
@pytest.mark.parametrize("fixed", [True, False])
def test_a_workspace_filled_to_its_disk_budget_is_graded_like_any_other(fixed):
    source = LocalCodeTasks(
        names=["leap_year"],
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_960_000,
        uid_count=64,
        disk_bytes=8 * 1024**2,
        disk_inodes=2_000,
    )
    env = source.make_env(source.all_tasks[0], 0)
    try:
        env.reset()
        if fixed:
            assert "edited" in act(env, FIX)
        full = act(env, "bash dd if=/dev/zero of=fill bs=64k count=1000; touch more; echo done")
        assert "No space left on device" in full
        outcome = env.outcome()  # before: OSError ENOSPC while copying the repository for grading
    finally:
        env.close()
    assert outcome.resolved is fixed, outcome.reason


@pytest.mark.parametrize(
    "path",
    [
        ".pytest.ini",
        "pkg/.pytest.ini",
        "pytest.ini",
        "sub/setup.cfg",
        "tox.ini",
        "pyproject.toml",
        "a/b/conftest.py",
        "x.egg-info/entry_points.txt",
    ],
)
def test_every_file_pytest_reads_configuration_or_plugins_from_is_protected(path):
    assert is_protected_path(path)  # before: .pytest.ini (read by pytest >= 8.1) was kept in the patch


# A plugin the work tree provides, named in an ini the install step wrote: pytest imports ini
# plugins before PYTEST_ADDOPTS's, so it runs before the reporter. It takes the key from the
# reporter's pipe, puts it back for the reporter, and turns every failure into a pass.
EVIL_PLUGIN = """
import os
import os

import pytest
fd = int(os.environ["TSL_REPORT_FD"])
key = os.read(fd, 4096)
r, w = os.pipe()
os.write(w, key)
os.close(w)
os.dup2(r, fd)
os.write(1, b"EVIL-PLUGIN-LOADED\\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    report.outcome, report.longrepr = "passed", None
"""
SETUP_WRITES_CONFIG = {
    "setup.cfg": 'open("setup.cfg", "w").write("[tool:pytest]\\naddopts = -p tsl_evil\\n")\n',
    ".pytest.ini": 'open(".pytest.ini", "w").write("[pytest]\\naddopts = -p tsl_evil\\n")\n',
}


def install_step_run(
    tmp_path,
    sandbox_dir,
    sandbox_budget,
    agent_files: dict[str, str],
    *,
    original_files: dict[str, str] | None = None,
    before_install: str = "",
    command: str | None = None,
    startup_files: bool = True,
):
    """The container path's eval run in bubblewrap (as in test_swebench_env) of an instance that is
    NOT fixed, whose script runs the agent's ``setup.py`` (the install step) before the tests.
    ``original_files`` join the original tree (before its manifest is taken), ``agent_files`` are
    the agent's (unprotected) files; ``before_install``: script lines before the install step;
    ``command``: the container's command (default :func:`eval_command`); ``startup_files=False``:
    the eval directory without the host's start-up modules (as before). Returns (spec, the run's
    result, its secrets, the original tree's configuration manifest)."""
    from swebench.harness.utils import make_test_spec

    from thundersync_lightning.envs.repo.pytest_config import manifest_command, parse_manifest
    from thundersync_lightning.envs.sandbox import BwrapConfig, BwrapSandbox, SandboxLimits, chown_tree
    from thundersync_lightning.envs.swebench.eval_run import (
        EVAL_DIR,
        STARTUP_FILES,
        EvalSecrets,
        eval_command,
        write_eval_dir,
    )
    from thundersync_lightning.envs.swebench.source import load_instances

    from .._support import TEST_POOL, git_repo, swebench_row
    from ..swebench.test_swebench_env import TASK, write_jsonl

    lease = TEST_POOL.acquire()
    try:
        work = tempfile.mkdtemp(dir=sandbox_dir)
        os.chmod(work, 0o711)
        repo = os.path.join(work, "testbed")
        os.mkdir(repo)
        base = git_repo(TASK, repo)
        (instance,) = load_instances(
            write_jsonl([swebench_row(TASK, image="unused", base_commit=base)], str(tmp_path))
        )
        spec = make_test_spec(instance)
        limits = BwrapConfig(SandboxLimits(timeout_s=60, max_output_bytes=1 << 20))
        for files in (original_files or {}, None, agent_files):
            if files is None:  # the original tree is complete: its manifest
                chown_tree(repo, lease.uid)
                original = parse_manifest(
                    BwrapSandbox(repo, lease.uid, limits, budget=sandbox_budget).run(manifest_command()).text
                )
                continue
            for name, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(repo, name)), exist_ok=True)
                with open(os.path.join(repo, name), "w") as f:
                    f.write(text)
        chown_tree(repo, lease.uid)
        start = ": '>>>>> Start Test Output'"
        script = spec.eval_script.replace(
            start, f"{before_install}\npython3 setup.py\n{start}"
        )  # the install step
        scripts = os.path.join(work, "eval")
        write_eval_dir(scripts, script, spec.log_parser, "/bin/bash")
        if not startup_files:
            for name, _ in STARTUP_FILES:
                os.unlink(os.path.join(scripts, name))
        box = BwrapSandbox(repo, lease.uid, limits, budget=sandbox_budget, ro_binds={scripts: EVAL_DIR})
        secrets = EvalSecrets.new()
        result = box.run(command or eval_command(), stdin=secrets.stdin())
    finally:
        lease.release()
    return spec, result, secrets, original


@needs_bwrap
@pytest.mark.parametrize("written", sorted(SETUP_WRITES_CONFIG))
def test_a_config_the_install_step_writes_voids_the_run(tmp_path, sandbox_dir, sandbox_budget, written):
    """The agent's setup.py, run by the script's install step, writes an ini that loads its plugin."""
    from thundersync_lightning.envs.swebench.eval_run import grade_eval_run

    from ..swebench.test_swebench_env import TASK

    spec, result, secrets, original = install_step_run(
        tmp_path,
        sandbox_dir,
        sandbox_budget,
        {"setup.py": SETUP_WRITES_CONFIG[written], "tsl_evil.py": EVIL_PLUGIN},
    )
    assert "EVIL-PLUGIN-LOADED" in result.text
    before = grade_eval_run(spec, result, secrets, TASK.gold_patch, declared=dict(TASK.files))
    assert before.resolved  # without the check: the unfixed instance is resolved, reward 1
    after = grade_eval_run(spec, result, secrets, TASK.gold_patch, declared=dict(TASK.files), config=original)
    assert not after.resolved and after.reward == 0.0
    assert f"/testbed/{written} added" in after.reason and "void run" in after.reason


@needs_bwrap
def test_a_mutation_task_whose_directory_the_agent_filled_is_graded_like_any_other():
    import json

    from thundersync_lightning.envs.mutations import MutationTasks

    from .test_tools import model_dir

    src = MutationTasks(
        action_format="tools",
        tokenizer_path=model_dir(),
        uid_base=3_980_000,
        uid_count=16,
        sandbox_root="/tmp/thundersync-test-mutations",
        disk_bytes=4 * 1024**2,
        disk_inodes=500,
    )
    task = src.validation_tasks()[0]
    tok = src.renderer.tokenizer
    fix = task.candidates[task.answer]
    env = src.make_env(task, 0)
    try:
        env.reset()
        for command in (
            f"cat > solution.py <<'EOF'\n{fix}\nEOF",
            "dd if=/dev/zero of=fill bs=64k count=200; echo x",
        ):
            text = f"<tool_call>{json.dumps({'name': 'bash', 'arguments': {'command': command}})}</tool_call>"
            env.step((*tok.encode(text, add_special_tokens=False), src.stop_token))
        reward = env.verdict()  # before: writing test_hidden.py into the full directory raised ENOSPC
    finally:
        env.close()
    assert reward == 1.0


def test_the_expected_manifest_follows_the_test_patch_and_any_difference_is_named():
    import hashlib

    from thundersync_lightning.envs.repo.pytest_config import config_changes, parse_manifest, with_contents

    digest = hashlib.sha256(b"old\n").hexdigest()
    original = parse_manifest(f"{digest}  /testbed/tests/conftest.py\n{digest}  /testbed/setup.cfg\n")
    patched = with_contents(
        original, {"tests/conftest.py": b"new\n", "tests/test_x.py": b"x", "tox.ini": None}
    )
    assert patched["/testbed/tests/conftest.py"] == hashlib.sha256(b"new\n").hexdigest()
    assert "/testbed/tests/test_x.py" not in patched  # not a configuration file
    seen = parse_manifest(
        f"{patched['/testbed/tests/conftest.py']}  /testbed/tests/conftest.py\n"
        "sha256sum: /testbed/setup.cfg: Permission denied\n"
        f"{digest}  /testbed/.pytest.ini\n"
    )
    assert config_changes(patched, patched) == []
    built = {"/testbed/pkg/test_speed.cpython-311-x86_64-linux-gnu.so": "1" * 64}
    assert config_changes(built, {k: "2" * 64 for k in built}) == []  # rebuilt: same presence
    assert config_changes({}, built) == [f"{next(iter(built))} added"]  # new: a shadow of test_speed.py
    assert config_changes(patched, seen) == [
        "/testbed/.pytest.ini added",
        "/testbed/setup.cfg removed",
        "sha256sum: /testbed/setup.cfg: Permission denied added",
    ]


# ---------------------------------------------------------------- start-up code, bytecode, shadows

# Turns every failure into a pass; loaded with `-p tsl_pass` (the agent's module, in the work tree).
PASS_PLUGIN = """
import os

import pytest
os.write(1, b"PASS-PLUGIN-LOADED\\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    report.outcome, report.longrepr = "passed", None
"""
# The install step writes a `sitecustomize` package (the protection matched `sitecustomize.py`
# only); Python imports it at start-up from the first sys.path entry that has one, and it adds the
# agent's plugin to PYTEST_ADDOPTS before pytest reads it.
SITECUSTOMIZE_SETUP = (
    "import os\nos.makedirs('sitecustomize', exist_ok=True)\n"
    "open('sitecustomize/__init__.py', 'w').write(\"import os\\nos.environ['PYTEST_ADDOPTS'] = "
    "os.environ.get('PYTEST_ADDOPTS', '') + ' -p tsl_pass'\\n\")\n"
)


@pytest.mark.parametrize(
    "path",
    [
        "sitecustomize/__init__.py",
        "lib/sitecustomize.cpython-311-x86_64-linux-gnu.so",
        "usercustomize/x.py",
        "sitecustomize.pyc",
        "test_calendar/__init__.py",
        "pkg/test_calendar.cpython-311-x86_64-linux-gnu.so",
        "a/calendar_test/__init__.py",
    ],
)
def test_every_form_python_imports_start_up_code_or_a_test_module_from_is_protected(path):
    assert is_protected_path(path)  # before: only the names sitecustomize.py / usercustomize.py / test_*.py


def test_a_package_named_like_a_graded_test_module_outside_the_test_patterns_is_protected():
    assert not is_protected_path("pkg/checks/__init__.py")
    assert is_protected_path("pkg/checks/__init__.py", ("pkg/checks.py",))  # a graded file `checks.py`


@needs_bwrap
def test_start_up_code_the_install_step_plants_in_the_work_tree_does_not_run(
    tmp_path, sandbox_dir, sandbox_budget
):
    from thundersync_lightning.envs.swebench.eval_run import grade_eval_run

    from ..swebench.test_swebench_env import TASK

    agent = {"setup.py": SITECUSTOMIZE_SETUP, "tsl_pass.py": PASS_PLUGIN}
    # /testbed is on sys.path at start-up in SWE-bench images (the editable install's .pth); here PYTHONPATH.
    runs = {
        host: install_step_run(
            tmp_path,
            sandbox_dir,
            sandbox_budget,
            agent,
            before_install="export PYTHONPATH=/testbed",
            startup_files=host,
        )
        for host in (False, True)
    }
    graded = {
        host: [
            grade_eval_run(spec, result, secrets, TASK.gold_patch, declared=dict(TASK.files), config=config)
            for config in (None, original)
        ]
        for host, (spec, result, secrets, original) in runs.items()
    }
    assert "PASS-PLUGIN-LOADED" in runs[False][1].text
    assert graded[False][0].resolved  # before: the unfixed instance resolved, reward 1
    assert "PASS-PLUGIN-LOADED" not in runs[True][1].text  # the host's sitecustomize is found first
    plain, checked = graded[True]
    assert not plain.resolved and "tests failed" in plain.reason and TASK.fail_to_pass[0] in plain.reason
    # and the manifest names the package the install step wrote: the run is void as well
    assert not checked.resolved and "/testbed/sitecustomize/__init__.py added" in checked.reason


# The install step writes pytest's assertion-rewrite cache for the repository's own, unchanged
# conftest.py (the header carries the source's mtime and size, which is all pytest checks): the
# manifest sees the same conftest.py, and pytest runs the cached code instead of it.
BYTECODE_SETUP = r"""
import importlib.util, marshal, os, struct, sys
import pytest
evil = ("import pytest\n"
        "@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    report = (yield).get_result()\n    report.outcome, report.longrepr = 'passed', None\n")
source = os.path.abspath("tests/conftest.py")
st = os.stat(source)
os.makedirs("tests/__pycache__", exist_ok=True)
with open(f"tests/__pycache__/conftest.{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc",
          "wb") as f:
    f.write(importlib.util.MAGIC_NUMBER + b"\0\0\0\0")
    f.write(struct.pack("<LL", int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF))
    f.write(marshal.dumps(compile(evil, source, "exec")))
"""


@needs_bwrap
def test_bytecode_the_install_step_wrote_is_not_read_by_the_graded_tests(
    tmp_path, sandbox_dir, sandbox_budget
):
    from thundersync_lightning.envs.swebench.eval_run import FRESH_BYTECODE, eval_command, grade_eval_run

    from ..swebench.test_swebench_env import TASK

    original = {"tests/conftest.py": "# the repository's own conftest\n"}
    outcomes = {}
    for fresh in (False, True):
        command = eval_command() if fresh else eval_command().replace(FRESH_BYTECODE, ":")
        spec, result, secrets, config = install_step_run(
            tmp_path,
            sandbox_dir,
            sandbox_budget,
            {"setup.py": BYTECODE_SETUP},
            original_files=original,
            command=command,
        )
        outcomes[fresh] = grade_eval_run(
            spec, result, secrets, TASK.gold_patch, declared=dict(TASK.files), config=config
        )
    # The runs differ only in the fresh bytecode cache. Before: resolved, manifest and all.
    assert outcomes[False].resolved, outcomes[False].reason
    after = outcomes[True]
    assert not after.resolved and "tests failed" in after.reason and TASK.fail_to_pass[0] in after.reason


# A task whose graded test module sits at the repository's root, outside any tests/ directory.
ROOT_TESTS = LocalTask(
    name="root_tests",
    problem_statement="answer() returns 41; it must return 42.\n",
    fail_to_pass=("test_answer.py::test_answer",),
    pass_to_pass=(),
    files=(
        ("pkg.py", "def answer():\n    return 41\n"),
        ("test_answer.py", "from pkg import answer\n\n\ndef test_answer():\n    assert answer() == 42\n"),
    ),
)
# A package beside the test module wins over it; setting __file__ passes pytest's import check.
SHADOW = {
    "test_answer/__init__.py": "__file__ = '/testbed/test_answer.py'\n\n\ndef test_answer():\n    pass\n"
}


@needs_bwrap
def test_a_package_that_shadows_a_graded_test_module_is_dropped_from_the_patch(sandbox_dir, sandbox_budget):
    from thundersync_lightning.envs.code import LocalWorkspace, WorkspaceSettings
    from thundersync_lightning.envs.repo.runner import (
        RUNNER_DIR,
        new_key,
        parse_results,
        runner_command,
        write_runner,
    )
    from thundersync_lightning.envs.sandbox import BwrapConfig, BwrapSandbox, SandboxLimits, chown_tree

    from .._support import TEST_POOL

    lease = TEST_POOL.acquire()
    try:  # before: the package, kept in the patch, stood in for the graded module (reward 1)
        work = os.path.join(sandbox_dir, "shadowed")
        os.mkdir(work)
        ROOT_TESTS.materialize(work)
        os.mkdir(os.path.join(work, "test_answer"))
        for rel, text in SHADOW.items():
            with open(os.path.join(work, rel), "w") as f:
                f.write(text)
        chown_tree(work, lease.uid)
        runner = os.path.join(sandbox_dir, "runner")
        write_runner(runner)
        box = BwrapSandbox(
            work,
            lease.uid,
            BwrapConfig(SandboxLimits(timeout_s=60.0)),
            budget=sandbox_budget,
            ro_binds={runner: RUNNER_DIR},
        )
        key = new_key()
        shadowed = parse_results(
            box.run(runner_command(ROOT_TESTS.fail_to_pass), stdin=(key + "\n").encode()).text, key
        )
        assert shadowed.lines == (("PASSED", "test_answer.py::test_answer"),)
    finally:
        lease.release()
    ws = LocalWorkspace(ROOT_TESTS, WorkspaceSettings(root=os.path.join(sandbox_dir, "ws")), TEST_POOL)
    try:
        ws.open()
        ws.run(
            "mkdir test_answer && cat > test_answer/__init__.py && echo 'def answer():\n"
            "    return 43' > pkg.py",
            stdin=SHADOW["test_answer/__init__.py"].encode(),
        )
        patch = ws.diff()
        assert "test_answer/__init__.py" in patch
        outcome = ws.evaluate(patch)
    finally:
        ws.close()
    assert not outcome.resolved
    assert outcome.report["tests_status"]["FAIL_TO_PASS"]["failure"] == ["test_answer.py::test_answer"]


# In a container of the instance's image: the agent's setup.py, run by the eval script's install
# step, plants pytest's assertion-rewrite cache for the graded test module itself (every graded
# test passes in it), or a sitecustomize package that loads its plugin; /testbed is on sys.path at
# start-up, as the editable install's .pth puts it in SWE-bench images.
CONTAINER_SETUP = {
    "bytecode": r"""
import importlib.util, marshal, os, struct, sys
import pytest
names = ("test_overlapping", "test_disjoint", "test_touching")
evil = "".join(f"def {n}():\n    pass\n\n\n" for n in names)
source = os.path.abspath("tests/test_intervals.py")
st = os.stat(source)
os.makedirs("tests/__pycache__", exist_ok=True)
with open(f"tests/__pycache__/test_intervals.{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc",
          "wb") as f:
    f.write(importlib.util.MAGIC_NUMBER + b"\0\0\0\0")
    f.write(struct.pack("<LL", int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF))
    f.write(marshal.dumps(compile(evil, source, "exec")))
""",
    "sitecustomize": SITECUSTOMIZE_SETUP,
}


@pytest.mark.container
@pytest.mark.parametrize("planted", sorted(CONTAINER_SETUP))
def test_in_a_container_what_the_install_step_plants_does_not_grade_the_run(
    instance_image, tmp_path, planted
):
    import json

    from thundersync_lightning.envs.swebench import SWEbenchTasks

    from .._support import swebench_row
    from ..swebench.test_swebench_env import TASK, write_jsonl

    tag, base = instance_image
    row = swebench_row(TASK, image=tag, base_commit=base)
    start = ": '>>>>> Start Test Output'"
    row["eval_script"] = row["eval_script"].replace(
        start, f"export PYTHONPATH=/testbed\npython3 setup.py\n{start}"
    )
    source = SWEbenchTasks(
        instances=write_jsonl([row], str(tmp_path)),
        engine="podman",
        command_timeout_s=60,
        eval_timeout_s=300,
        memory="1g",
        nproc=256,
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_970_000,
        uid_count=32,
    )
    (task,) = source.tasks(0, 1, 0)
    env = source.make_env(task, 0)
    files = {"setup.py": CONTAINER_SETUP[planted], "tsl_pass.py": PASS_PLUGIN}
    try:
        env.reset()
        for name, text in files.items():
            act(env, f"bash\ncat > {name} <<'EOF_F'\n{text}EOF_F\necho {json.dumps(name)} written")
        env.step(CODEC.encode("submit"))
        assert env.verdict() == 0.0  # before (bytecode): every graded test passed, reward 1
        outcome = env.outcome()
    finally:
        env.close()
    if planted == "bytecode":  # the tests ran, from the source
        assert outcome.report["tests_status"]["FAIL_TO_PASS"]["failure"] == list(TASK.fail_to_pass)
    else:  # the package is not imported at start-up, and the manifest names it
        assert "/testbed/sitecustomize/__init__.py added" in outcome.reason


def test_the_manifest_lists_exactly_the_files_listed_names(sandbox_dir):
    import subprocess

    from thundersync_lightning.envs.repo.pytest_config import listed, manifest_command, parse_manifest

    root = os.path.join(sandbox_dir, "testbed")  # no "test_" in the path above the tree (patterns span "/")
    files = [
        "conftest.py",
        "sub/setup.cfg",
        "sitecustomize/__init__.py",
        "lib/usercustomize.py",
        "sitecustomize.pyc",
        "tests/test_x/__init__.py",
        "pkg/test_y.cpython-311-x86_64-linux-gnu.so",
        "pkg/y_test.so",
        "src/mod.py",
        "tests/test_z.py",
        "tests/helpers/__init__.py",
        "README.md",
        ".git/conftest.py",
    ]
    for rel in files:
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w") as f:
            f.write(rel)
    os.symlink(os.path.join(root, "src"), os.path.join(root, "tests", "test_linked"))  # not descended into
    out = subprocess.run(["bash", "-c", manifest_command(root)], capture_output=True, text=True).stdout
    seen = set(parse_manifest(out))
    expected = {f"{root}/{rel}" for rel in files if not rel.startswith(".git/") and listed(f"{root}/{rel}")}
    assert {p for p in seen if "test_linked" not in p} == expected
    assert expected == {f"{root}/{rel}" for rel in files[:8]}
    assert any("test_linked" in p for p in seen)  # the link stands for the directory (a digest error: "?")
