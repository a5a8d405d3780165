"""SWE-smith-style instance building (envs/swebench/synth.py) on a tiny library made here, and the
committed instances (configs/data/swe_cpu_instances.jsonl, built by scripts/build_swe_instances.py)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from thundersync_lightning.envs.swebench.synth import (
    PytestRun,
    Site,
    apply_site,
    eval_script,
    find_sites,
    gold_patch,
    gradable,
    parse_test_run,
    problem_statement,
    select_bugs,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
INSTANCES = os.path.join(ROOT, "configs", "data", "swe_cpu_instances.jsonl")
REPORT = os.path.join(ROOT, "configs", "data", "swe_cpu_validation.json")

TINY = '''"""A tiny library."""

LIMIT = 3 + 4


def clamp(x, lo=0, hi=10):
    """Docstring: 1 < 2."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(xs):
    s = 0
    for x in xs:
        s += x
    return s


class Box:
    @staticmethod
    def inside(x, lo, hi):
        return lo <= x and x <= hi

    def nested(self, n):
        def step(k):
            return k * 2 + 1
        return [step(i) for i in range(n)]
'''

TINY_TESTS = """from tinylib import Box, clamp, total


def test_clamp_low():
    assert clamp(-5) == 0


def test_clamp_high():
    assert clamp(50) == 10


def test_clamp_inside():
    assert clamp(4) == 4


def test_total():
    assert total([1, 2, 3]) == 6


def test_inside():
    assert Box.inside(2, 1, 3) and not Box.inside(5, 1, 3)


def test_nested():
    assert Box().nested(3) == [1, 3, 5]
"""


def test_every_site_rewrites_only_its_own_bytes_and_equals_the_tree_edit():
    found = find_sites("tinylib.py", TINY)
    assert found
    data = TINY.encode()
    for site in found:
        mutated = apply_site(TINY, site)
        assert mutated is not None, site
        out = mutated.encode()
        assert out[: site.start] == data[: site.start]
        assert out[site.start + len(site.new.encode()) :] == data[site.end :]
        assert ast.dump(ast.parse(mutated)) != ast.dump(ast.parse(TINY))


def test_sites_lie_in_function_bodies_named_by_qualified_function():
    found = find_sites("tinylib.py", TINY)
    functions = {s.function for s in found}
    # `LIMIT = 3 + 4` (module level), the defaults lo=0 / hi=10 and the docstring's text give no site
    assert functions == {"clamp", "total", "Box.inside", "Box.nested.step"}  # nested() itself has none
    lines = TINY.split("\n")
    assert all("def " not in lines[s.line - 1] for s in found)
    step = [s for s in found if s.function == "Box.nested.step"]
    assert {(s.old, s.kind) for s in step} == {
        ("*", "op_swap"),
        ("+", "op_swap"),
        ("2", "const_shift"),
        ("1", "const_shift"),
    }
    assert {s.kind for s in found} == {"cmp_flip", "op_swap", "bool_swap", "const_shift"}
    augmented = [s for s in found if s.function == "total" and s.kind == "op_swap"]
    assert augmented and all(s.old == "+=" and s.new.endswith("=") for s in augmented)


def test_a_site_whose_text_no_longer_matches_is_refused():
    site = find_sites("tinylib.py", TINY)[0]
    assert apply_site(TINY.replace("A tiny library.", "A tiny library, edited."), site) is None


def test_a_literal_in_another_notation_or_a_negative_replacement_is_never_offered():
    source = "def f(xs):\n    return xs[0] + 0x10 + 1_000\n"
    found = find_sites("m.py", source)
    constants = [s for s in found if s.kind == "const_shift"]
    assert [(s.old, s.new) for s in constants] == [("0", "1")]  # not "-1", not the hex / underscored literals


def _run(statuses: dict[str, str]) -> PytestRun:
    return PytestRun(statuses, {t: f"{t} broke" for t, s in statuses.items() if s == "FAILED"})


BASE = _run(
    {f"t.py::test_{i}": "PASSED" for i in range(6)}
    | {"t.py::test_flaky": "FAILED", "t.py::test_x[a b]": "PASSED"}
)


def _fake(site: Site) -> PytestRun | None:
    """A stand-in test run: which tests a site breaks follows from its line; line 9 crashes the run."""
    if site.line == 9:
        return None
    broken = {f"t.py::test_{i}" for i in range(6) if (site.line + i) % 4 == 0}
    if site.line == 11:
        broken = {f"t.py::test_{i}" for i in range(6)}  # breaks everything: more than max_fail_to_pass
    return _run({t: ("FAILED" if t in broken else s) for t, s in BASE.statuses.items()})


def test_bug_selection_is_seeded_one_per_function_and_grades_only_tests_that_passed_clean():
    candidates = find_sites("tinylib.py", TINY)
    first = select_bugs(
        candidates, BASE, _fake, seed=3, count=4, max_tries=50, max_fail_to_pass=3, num_pass_to_pass=2
    )
    assert first == select_bugs(
        list(reversed(candidates)),
        BASE,
        _fake,
        seed=3,
        count=4,
        max_tries=50,
        max_fail_to_pass=3,
        num_pass_to_pass=2,
    )
    assert first and len({b.site.function for b in first}) == len(first)
    for bug in first:
        assert bug.site.line not in (9, 11)
        assert 1 <= len(bug.fail_to_pass) <= 3 and len(bug.pass_to_pass) == 2
        assert not set(bug.fail_to_pass) & set(bug.pass_to_pass)
        graded = set(bug.fail_to_pass) | set(bug.pass_to_pass)
        assert (
            "t.py::test_flaky" not in graded and "t.py::test_x[a b]" not in graded
        )  # failed clean / unparseable
        assert bug.messages[0] == (bug.fail_to_pass[0], f"{bug.fail_to_pass[0]} broke")


def test_bug_selection_stops_after_max_tries():
    calls = []

    def counting(site):
        calls.append(site)
        return _fake(site)

    select_bugs(find_sites("tinylib.py", TINY), BASE, counting, seed=0, count=100, max_tries=3)
    assert len(calls) == 3


def test_the_pytest_log_is_read_as_swebench_reads_it_and_addresses_are_blanked():
    log = (
        "PASSED a.py::test_a\nFAILED a.py::test_b - AssertionError: <object at 0x7f3a2b> != 3\n"
        "ERROR a.py::test_c - ValueError: bad\nSKIPPED [1] a.py:3: why\n"
        "PASSED a.py::test_d[two words]\nFAILED a.py::test_e[x y] - assert 1 == 2\n"
    )
    run = parse_test_run(log)  # test_d / test_e: swebench would read "a.py::test_d[two": never graded
    assert run.statuses == {"a.py::test_a": "PASSED", "a.py::test_b": "FAILED", "a.py::test_c": "ERROR"}
    assert run.messages["a.py::test_b"] == "AssertionError: <object at 0x...> != 3"
    assert run.passed() == {"a.py::test_a"}
    assert gradable("a.py::test[x-y]") and not gradable("a.py::test[x y]")


def test_the_gold_patch_applies_with_git_and_the_statement_never_shows_the_fix(tmp_path):
    site = next(
        s for s in find_sites("tinylib.py", TINY) if s.function == "clamp" and s.old == "<" and s.new == ">="
    )
    buggy = apply_site(TINY, site)
    assert buggy is not None
    patch = gold_patch("tinylib.py", buggy, TINY)
    (tmp_path / "tinylib.py").write_text(buggy)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=patch.encode(), check=True, capture_output=True)
    assert (tmp_path / "tinylib.py").read_text() == TINY
    from thundersync_lightning.envs.swebench.synth import Bug

    bug = Bug(
        site, ("t.py::test_0", "t.py::test_1"), ("t.py::test_2",), (("t.py::test_0", "assert -5 == 0"),)
    )
    text = problem_statement(bug, ["t.py"])
    assert "`clamp`" in text and "assert -5 == 0" in text and "1 more failing" in text
    assert "x < lo" not in text and "x >= lo" not in text and "+    if" not in text


def test_a_bug_injected_into_a_tiny_library_fails_its_tests_and_the_gold_patch_makes_them_pass(tmp_path):
    (tmp_path / "tinylib.py").write_text(TINY)
    (tmp_path / "test_tinylib.py").write_text(TINY_TESTS)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}

    def pytest_run() -> PytestRun | None:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-rA", "--tb=no", "-p", "no:cacheprovider", "test_tinylib.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return parse_test_run(done.stdout) if done.returncode in (0, 1) else None

    def run(site: Site) -> PytestRun | None:
        (tmp_path / "tinylib.py").write_text(apply_site(TINY, site) or TINY)
        try:
            return pytest_run()
        finally:
            (tmp_path / "tinylib.py").write_text(TINY)

    baseline = pytest_run()
    assert baseline is not None and len(baseline.passed()) == 6
    (bug,) = select_bugs(find_sites("tinylib.py", TINY), baseline, run, seed=1, count=1, max_tries=10)
    buggy = apply_site(TINY, bug.site)
    assert buggy is not None
    (tmp_path / "tinylib.py").write_text(buggy)
    broken = pytest_run()
    assert broken is not None
    assert {t for t, s in broken.statuses.items() if s == "FAILED"} == set(bug.fail_to_pass)
    subprocess.run(
        ["git", "apply", "-"],
        cwd=tmp_path,
        input=gold_patch("tinylib.py", buggy, TINY).encode(),
        check=True,
        capture_output=True,
    )
    fixed = pytest_run()
    assert fixed is not None and set(bug.fail_to_pass) <= fixed.passed()


def test_the_eval_script_has_swebenchs_markers_around_one_targeted_pytest_run():
    script = eval_script("abc123", ["tests/test_a.py"], ("-o", "addopts="), pythonpath="src")
    lines = script.split("\n")
    start, end = lines.index(": '>>>>> Start Test Output'"), lines.index(": '>>>>> End Test Output'")
    assert lines[start + 1] == "python3 -m pytest -rA --tb=no -p no:cacheprovider -o addopts= tests/test_a.py"
    assert end == start + 2 and lines[4].endswith("checkout abc123 -- tests/test_a.py")
    assert lines.index("export PYTHONPATH=src") < start  # the eval run prepends its reporter's directory


# ---------------------------------------------------------------- the committed instances


def _rows() -> list[dict]:
    if not os.path.isfile(INSTANCES):
        pytest.skip("no committed instances (scripts/build_swe_instances.py build)")
    with open(INSTANCES) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_the_committed_instances_are_swebench_rows_from_five_licensed_libraries():
    from thundersync_lightning.envs.swebench.source import load_instances

    rows = _rows()
    assert [r["instance_id"] for r in load_instances(INSTANCES)] == [r["instance_id"] for r in rows]
    assert len(rows) >= 30 and len({r["instance_id"] for r in rows}) == len(rows)
    assert len({r["repo"] for r in rows}) >= 5
    for row in rows:
        prov = row["provenance"]
        assert prov["license"] and len(prov["sdist_sha256"]) == 64 and prov["version"] == row["version"]
        assert row["image"] == f"localhost/tsl-swe.eval.{row['instance_id'].lower()}:latest"
        assert json.loads(row["FAIL_TO_PASS"]) and row["test_patch"] == ""
        assert not set(json.loads(row["FAIL_TO_PASS"])) & set(json.loads(row["PASS_TO_PASS"]))
        assert row["base_commit"] in row["eval_script"] and row["log_parser"] == "parse_log_pytest"
        added = [
            line[1:].strip()
            for line in row["patch"].split("\n")
            if line.startswith("+") and not line.startswith("+++")
        ]
        assert added and not any(a in row["problem_statement"] for a in added if a)


def test_the_validation_report_shows_every_committed_instance_valid_gold_resolved_and_empty_not():
    rows = _rows()
    if not os.path.isfile(REPORT):
        pytest.skip("no validation report (scripts/build_swe_instances.py validate)")
    with open(REPORT) as f:
        report = json.load(f)
    by_id = {r["instance_id"]: r for r in report["instances"]}
    for row in rows:
        r = by_id[row["instance_id"]]
        assert r["valid"] and r["gold_resolved"] and not r["empty_resolved"]
        assert r["base_fail_to_pass_failing"] and r["base_pass_to_pass_passing"]
    assert report["gold_resolved_rate"] == 1.0 and report["empty_resolved_rate"] == 0.0
