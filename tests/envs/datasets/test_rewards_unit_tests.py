"""The built-in ``unit_tests`` reward pays only when every assert ran: the red team's early exits
(``sys.exit(0)``, ``raise SystemExit``, ``os._exit(0)`` before a wrong ``add``) score 0, and the
run's nonce is nowhere the completion can read it."""

from __future__ import annotations

import pytest

from thundersync_lightning.envs.datasets.rewards import unit_tests

from .._support import needs_bwrap

TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
WRONG = "def add(a, b):\n    return a - b\n"


def _score(completion: str, tests: str = TESTS) -> float:
    return unit_tests("", completion, tests=tests, uid_base=3_957_200, uid_count=2)


@needs_bwrap
@pytest.mark.parametrize(
    "exit_early",
    ["import sys\nsys.exit(0)\n", "raise SystemExit\n", "import os\nos._exit(0)\n"],
    ids=["sys.exit(0)", "raise SystemExit", "os._exit(0)"],
)
def test_a_wrong_add_that_exits_before_the_asserts_scores_zero(exit_early):
    assert _score(WRONG + exit_early) == 0.0  # before: 1.0 (the exit status was the verdict)


@needs_bwrap
def test_a_right_add_scores_one_and_a_wrong_one_zero():
    assert _score("```python\ndef add(a, b):\n    return a + b\n```") == 1.0
    assert _score(WRONG) == 0.0


SNOOP = r"""
import os, re, sys
found = []
def grab(data):
    found.extend(re.findall(rb"[0-9a-f]{32}", data))
for path in ["/proc/self/cmdline", "/proc/self/environ", f"/proc/{os.getppid()}/cmdline",
             f"/proc/{os.getppid()}/environ", *os.listdir(".")]:
    try:
        with open(path, "rb") as f:
            grab(f.read())
    except OSError:
        pass
for fd in range(64):
    try:
        grab(os.read(fd, 4096))
    except OSError:
        pass
grab(" ".join(sys.argv).encode() + repr(dict(os.environ)).encode())
os.write(1, b"\n" + (found[0] if found else b"none") + b"\n")
os._exit(0)
"""


@needs_bwrap
def test_the_nonce_is_in_no_file_argument_environment_or_open_descriptor_of_the_completion():
    assert _score(WRONG + SNOOP) == 0.0


PATCHES = """
import builtins, os
builtins.exec = lambda *args, **kwargs: None  # skip the tests
builtins.print = lambda *args, **kwargs: None
os.write = lambda fd, data: len(data)
"""


@needs_bwrap
def test_patching_exec_print_or_os_write_neither_skips_the_asserts_nor_hides_a_pass():
    assert _score(WRONG + PATCHES) == 0.0
    assert _score("def add(a, b):\n    return a + b\n" + PATCHES) == 1.0


@needs_bwrap
def test_a_completion_that_prints_a_fake_nonce_line_scores_zero():
    fake = "print('\\n' + '0' * 32)\nimport os\nos._exit(0)\n"
    assert _score(WRONG + fake) == 0.0
