"""The source of a user's own tools and rewards module, written into a test's directory: tools that
work, hang, raise, kill their process or lack type hints, and two rewards."""

TOOLS = '''
import os, time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def wait(seconds: int) -> str:
    """Never comes back.

    Args:
        seconds: how long
    """
    time.sleep(3600)
    return "done"


def explode(reason: str) -> str:
    """Raise.

    Args:
        reason: why
    """
    raise RuntimeError("exploded: " + reason)


def vanish() -> str:
    """Kill its own process."""
    os._exit(3)


def untyped(x):
    return x


def correct(prompt, completion, answer, **row):
    return float(str(answer) in completion)


def brief(prompt, completion, **row):
    return float(len(completion) < 40)
'''
