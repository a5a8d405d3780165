"""What remains of the page-cache channel through the sandboxes' shared read-only ``/usr``.

Every bubblewrap sandbox binds the host's ``/usr`` read-only, so they share its page cache: a
grading run that reads a page of a ``/usr`` file makes a later read of that page by another sandbox
fast. With eviction allowed (``posix_fadvise(DONTNEED)``, ``madvise(MADV_PAGEOUT / MADV_COLD)``)
the same page carried any number of bits; the seccomp filter now refuses those calls and the
clock-free probes (``cachestat``, ``preadv2(RWF_NOWAIT)``) (``envs/sandbox/seccomp.py``), so what
remains is one-shot: a page nobody has read yet is one bit, readable once, by timing the first read.

Measured here, with the filter on:

1. the supply: regular files under ``/usr`` and how many of their pages are not cached now
   (``cachestat`` on the host, as root: the harness, not a sandbox);
2. the channel: ``--pages`` pages of the largest ``/usr`` files, 1 MiB apart (beyond readahead),
   made cold by the harness; a sender sandbox reads the pages of a random bit string's ones; a
   receiver sandbox (another uid) times a one-byte ``pread`` of every page. Latency medians of
   cached and cold pages, the bit error rate of the best threshold (an upper bound on what a
   receiver that must guess the threshold gets), and bits per page ``1 - H(error rate)``;
3. that the sender cannot reset a page (``posix_fadvise(DONTNEED)`` inside the sandbox: EPERM).

    python benchmarks/page_cache_channel.py [--quick] [--pages N] [--out DIR]

Needs root and bubblewrap (as the sandbox tests do).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_common_args, median, write_result  # noqa: E402

NAME = "page_cache_channel"
PAGE = 4096
SPACING = 1 << 20  # beyond the kernel's readahead window (128 KiB by default)
_CACHESTAT = 451  # x86_64 and aarch64

_SENDER = r"""
import json, os, sys
pages = json.loads(sys.stdin.read())
for path, off in pages:
    fd = os.open(path, os.O_RDONLY)
    os.pread(fd, 1, off)
    os.close(fd)
fd = os.open(pages[0][0], os.O_RDONLY)
try:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    print("fadvise ok")
except OSError as e:
    print("fadvise", e.errno)
"""
_RECEIVER = r"""
import json, os, sys, time
pages = json.loads(sys.stdin.read())
fds = {p: os.open(p, os.O_RDONLY) for p in {p for p, _ in pages}}
out = []
for path, off in pages:
    t = time.perf_counter_ns()
    os.pread(fds[path], 1, off)
    out.append(time.perf_counter_ns() - t)
print(json.dumps(out))
"""


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_uint64)
        for n in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def cached_pages(fd: int, off: int = 0, length: int = 0) -> int | None:
    """Pages of ``fd``'s range in the page cache (``cachestat``, Linux >= 6.5); None when unsupported."""
    stat = _Stat()
    r = _libc.syscall(_CACHESTAT, fd, ctypes.byref(_Range(off, length)), ctypes.byref(stat), 0)
    return None if r < 0 else int(stat.nr_cache)


def supply(root: str = "/usr") -> dict:
    files = total = cached = 0
    for top, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(top, name)
            try:
                if not os.path.isfile(path) or os.path.islink(path):
                    continue
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                size = os.fstat(fd).st_size
                n = cached_pages(fd)
            finally:
                os.close(fd)
            if n is None:
                return {"supported": False}
            files += 1
            total += (size + PAGE - 1) // PAGE
            cached += n
    return {
        "supported": True,
        "files": files,
        "pages": total,
        "cached_pages": cached,
        "cold_pages": total - cached,
        "cold_bytes": (total - cached) * PAGE,
    }


def pick_pages(n: int, seed: int) -> list[tuple[str, int]]:
    """``n`` page offsets of the largest /usr files, ``SPACING`` apart."""
    sizes = []
    for top, _dirs, names in os.walk("/usr"):
        for name in names:
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path):
                try:
                    if os.access(path, os.R_OK) and os.stat(path).st_mode & 0o004:
                        sizes.append((os.path.getsize(path), path))
                except OSError:
                    continue
    pages: list[tuple[str, int]] = []
    for size, path in sorted(sizes, reverse=True):
        pages += [(path, off) for off in range(SPACING, size - PAGE, SPACING)]
        if len(pages) >= 2 * n:
            break
    random.Random(seed).shuffle(pages)
    return pages[:n]


def evict(pages: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Make ``pages`` cold (the harness, as root, outside any sandbox);
    those still cached after are dropped."""
    cold = []
    for path, off in pages:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, off - SPACING // 2, SPACING, os.POSIX_FADV_DONTNEED)
            if cached_pages(fd, off, PAGE) in (0, None):
                cold.append((path, off))
        finally:
            os.close(fd)
    return cold


def channel(n: int, seed: int) -> dict:
    from thundersync_lightning.envs.sandbox import (
        BwrapConfig,
        BwrapSandbox,
        SandboxLimits,
        UidPool,
        chown_tree,
    )
    from thundersync_lightning.envs.sandbox.fs import BoundedDir

    pages = evict(pick_pages(n, seed))
    rng = random.Random(seed + 1)
    bits = [rng.random() < 0.5 for _ in pages]
    ones = [p for p, b in zip(pages, bits) if b]
    pool = UidPool(base=3_700_000, size=16)
    root = tempfile.mkdtemp(prefix="tsl-pagecache-", dir="/tmp")
    os.chmod(root, 0o711)
    out: dict = {}
    try:
        for role, script, payload in (("sender", _SENDER, ones), ("receiver", _RECEIVER, pages)):
            lease = pool.acquire()
            work = os.path.join(root, role)
            os.mkdir(work)
            budget = BoundedDir(work, 16 * 1024**2, 1000, 0o700)
            try:
                chown_tree(work, lease.uid)
                box = BwrapSandbox(
                    work,
                    lease.uid,
                    BwrapConfig(SandboxLimits(timeout_s=300.0, max_output_bytes=1 << 24)),
                    budget=budget,
                )
                result = box.run(f"python3 -c {shlex.quote(script)}", stdin=json.dumps(payload).encode())
            finally:
                budget.remove()
                lease.release()
            if not result.ok:
                raise RuntimeError(f"{role} failed: {result.text[-2000:]}")
            out[role] = result.text.strip()
    finally:
        os.rmdir(root) if os.path.isdir(root) and not os.listdir(root) else None
    latencies = json.loads(out["receiver"].splitlines()[-1])
    one = [t for t, b in zip(latencies, bits) if b]
    zero = [t for t, b in zip(latencies, bits) if not b]
    best = min(sum((t > cut) == b for t, b in zip(latencies, bits)) for cut in sorted(latencies) + [0])
    error = best / len(bits)
    entropy = 0.0 if error in (0.0, 1.0) else -(error * math.log2(error) + (1 - error) * math.log2(1 - error))
    return {
        "pages": len(pages),
        "ones": len(one),
        "cached_read_median_us": median(one) / 1000,
        "cold_read_median_us": median(zero) / 1000,
        "best_threshold_error_rate": error,
        "bits_per_page": 1.0 - entropy,
        "sender_fadvise": out["sender"].splitlines()[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument("--pages", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n = 256 if args.quick else args.pages
    payload = {
        "settings": {"pages": n, "seed": args.seed, "spacing_bytes": SPACING, "kernel": os.uname().release},
        "supply": supply(),
        "channel": channel(n, args.seed),
    }
    path = write_result(args.out, NAME, payload)
    ch, su = payload["channel"], payload["supply"]
    print(
        f"{path}: cached {ch['cached_read_median_us']:.1f} us vs cold {ch['cold_read_median_us']:.1f} us, "
        f"error {ch['best_threshold_error_rate']:.4f}, {ch['bits_per_page']:.3f} bits/page; "
        f"cold /usr pages now: {su.get('cold_pages')}; sender fadvise: {ch['sender_fadvise']}"
    )


if __name__ == "__main__":
    main()
