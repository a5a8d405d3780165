#!/usr/bin/env python3
"""SWE-bench-format instances from real pure-Python libraries, their images, and their validation.

    build     download each library's source distribution from PyPI (sha256-pinned), inject bugs
              SWE-smith style into functions its own tests cover (envs/swebench/synth.py), write
              the instances (swebench 5 schema + provenance) as JSONL. Deterministic: the same
              sdists and seed give the same bytes.
    images    one environment image per library version (the base image + the library's
              dependencies, offline), and per instance a thin image with its buggy /testbed (a git
              repository whose one commit is the instance's base_commit), named as the row's
              `image` says. Local images only: `podman build --pull=never`.
    validate  every instance through the project's SWE-bench workspace, eval script and swebench's
              get_eval_report, as SWE-bench validates: the gold patch resolves; the empty patch does
              not; a patch that changes no code (a note file) leaves FAIL_TO_PASS failing and
              PASS_TO_PASS passing on the base. Instances that fail are dropped from the JSONL with
              the reason printed; the report is written as JSON.

Test runs while building use the host's Debian python3 + pytest (the image's, scripts/build_test_image.sh),
in a scratch copy, with the library's own test files. Usage:

    python scripts/build_swe_instances.py build --out configs/data/swe_cpu_instances.jsonl
    python scripts/build_swe_instances.py images --instances configs/data/swe_cpu_instances.jsonl
    python scripts/build_swe_instances.py validate --instances configs/data/swe_cpu_instances.jsonl \
        --report configs/data/swe_cpu_validation.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass

from thundersync_lightning.envs.swebench.synth import (
    Bug,
    PytestRun,
    apply_site,
    eval_script,
    find_sites,
    gold_patch,
    parse_test_run,
    problem_statement,
    select_bugs,
)

BASE_IMAGE = "localhost/thundersync-pytest:latest"  # scripts/build_test_image.sh: Debian python3 + pytest
CREATED_AT = "2026-12-06T00:00:00Z"
_GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "thundersync",
    "GIT_AUTHOR_EMAIL": "swe@localhost",
    "GIT_COMMITTER_NAME": "thundersync",
    "GIT_COMMITTER_EMAIL": "swe@localhost",
    "GIT_AUTHOR_DATE": "2026-12-06T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-12-06T00:00:00Z",
}


@dataclass(frozen=True, slots=True)
class Library:
    """A library version, the module bugs go into and the test files that grade them."""

    name: str
    version: str
    sdist_sha256: str
    license: str
    module: str  # path inside the sdist
    tests: tuple[str, ...]
    pythonpath: str = ""  # for src layouts
    pytest_args: tuple[str, ...] = ()
    deps: tuple[str, ...] = ()  # runtime dependencies (pip requirement strings) installed in the env image

    @property
    def sdist(self) -> str:
        return f"{self.name}-{self.version}.tar.gz"

    @property
    def env_image(self) -> str:
        return f"localhost/tsl-swe-env.{self.name}:{self.version}"


LIBRARIES: tuple[Library, ...] = (
    Library(
        "toolz",
        "1.0.0",
        "2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02",
        "BSD-3-Clause",
        "toolz/itertoolz.py",
        ("toolz/tests/test_itertoolz.py",),
    ),
    Library(
        "boltons",
        "24.1.0",
        "4a49b7d57ee055b83a458c8682a2a6f199d263a8aa517098bda9bab813554b87",
        "BSD-3-Clause",
        "boltons/strutils.py",
        ("tests/test_strutils.py",),
    ),
    Library(
        "inflection",
        "0.5.1",
        "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417",
        "MIT",
        "inflection/__init__.py",
        ("test_inflection.py",),
    ),
    Library(
        "cachetools",
        "5.5.0",
        "2cc24fb4cbe39633fb7badd9db9ca6295d766d9c2995f245725a46715d050f2a",
        "MIT",
        "src/cachetools/__init__.py",
        ("tests/test_lru.py", "tests/test_lfu.py", "tests/test_fifo.py"),
        pythonpath="src",
    ),
    Library(
        "wcwidth",
        "0.2.13",
        "72ea0c06399eb286d978fdedb6923a9eb47e1c486ce63e9b4e64fc18303972b5",
        "MIT",
        "wcwidth/wcwidth.py",
        ("tests/test_core.py",),
        pytest_args=("-o", "addopts="),
    ),  # tox.ini asks for pytest-cov
    Library(
        "six",
        "1.16.0",
        "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926",
        "MIT",
        "six.py",
        ("test_six.py",),
    ),
    Library(
        "markdown",
        "3.7",
        "2ae2471477cfd02dbbf038d5d9bc226d40def84b4fe2986e49b59b6b472bbed2",
        "BSD-3-Clause",
        "markdown/inlinepatterns.py",
        (
            "tests/test_syntax/inline/test_emphasis.py",
            "tests/test_syntax/inline/test_links.py",
            "tests/test_syntax/inline/test_images.py",
        ),
    ),
)


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------- sources


def fetch(lib: Library, cache: str) -> str:
    """The library's sdist in ``cache`` (pip download from the package index), sha256-checked."""
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, lib.sdist)
    if not os.path.isfile(path):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-binary",
                ":all:",
                "--no-deps",
                "--no-build-isolation",
                "-d",
                cache,
                f"{lib.name}=={lib.version}",
            ],
            check=True,
        )
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    if digest != lib.sdist_sha256:
        raise SystemExit(f"{path}: sha256 {digest} is not the pinned {lib.sdist_sha256}; delete it and retry")
    return path


def extract(sdist: str, dest: str) -> str:
    """The sdist's files under ``dest`` (its top directory stripped; egg-info build output dropped)."""
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            parts = m.name.split("/", 1)
            if (
                len(parts) < 2
                or not (m.isfile() or m.isdir())
                or ".egg-info" in parts[1]
                or parts[1] == "PKG-INFO"
            ):
                continue
            m.name = parts[1]
            members.append(m)
        tar.extractall(dest, members=members, filter="data")
    return dest


def run_tests(tree: str, lib: Library, python: str, timeout_s: float = 300.0) -> PytestRun | None:
    """The library's targeted tests in ``tree`` (Debian python3 + pytest, no network needed)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": tree,
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
        "COLUMNS": "240",
    }  # pytest cuts summary messages to the terminal width
    if lib.pythonpath:
        env["PYTHONPATH"] = lib.pythonpath
    try:
        done = subprocess.run(
            [
                python,
                "-m",
                "pytest",
                "-rA",
                "--tb=no",
                "-p",
                "no:cacheprovider",
                *lib.pytest_args,
                *lib.tests,
            ],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode not in (0, 1):  # 2: interrupted, 3: internal error, 4: usage, 5: no tests
        return None
    return parse_test_run(done.stdout)


def git_commit(tree: str) -> str:
    """``tree`` made a git repository of one commit (fixed author, dates): its sha."""
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "--no-gpg-sign", "-m", "base"]):
        subprocess.run(
            ["git", "-c", "init.defaultBranch=main", *args],
            cwd=tree,
            env=_GIT_ENV,
            check=True,
            capture_output=True,
        )
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tree, env=_GIT_ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


def instance_id(lib: Library, bug: Bug) -> str:
    h = hashlib.blake2b(bug.site.key.encode(), digest_size=4).hexdigest()
    return f"{lib.name}__{lib.name}-{lib.version}.{bug.site.kind}__{h}"


def image_name(iid: str) -> str:
    return f"localhost/tsl-swe.eval.{iid.lower()}:latest"


def buggy_tree(lib: Library, row: dict, sdist: str, dest: str) -> str:
    """The instance's /testbed: the clean sdist with the gold patch reversed, committed; its sha
    must be the row's base_commit."""
    extract(sdist, dest)
    done = subprocess.run(
        ["git", "apply", "-R", "--whitespace=nowarn", "-"],
        cwd=dest,
        env=_GIT_ENV,
        input=row["patch"].encode(),
        capture_output=True,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"{row['instance_id']}: the gold patch does not reverse onto the sdist: {done.stderr!r}"
        )
    sha = git_commit(dest)
    if sha != row["base_commit"]:
        raise SystemExit(
            f"{row['instance_id']}: rebuilt base commit {sha} is not the row's {row['base_commit']}"
        )
    return sha


# ---------------------------------------------------------------- build


def build_library(lib: Library, cache: str, python: str, seed: int, count: int, max_tries: int) -> list[dict]:
    sdist = fetch(lib, cache)
    with tempfile.TemporaryDirectory(prefix=f"tsl-swe-{lib.name}-") as work:
        clean_dir = extract(sdist, os.path.join(work, "clean"))
        target = os.path.join(clean_dir, lib.module)
        clean = open(target, encoding="utf-8").read()
        baseline = run_tests(clean_dir, lib, python)
        if baseline is None or not baseline.passed():
            raise SystemExit(f"{lib.name} {lib.version}: the targeted tests do not run on the clean tree")

        def run(site):
            mutated = apply_site(clean, site)
            if mutated is None:
                return None
            with open(target, "w", encoding="utf-8") as f:
                f.write(mutated)
            try:
                return run_tests(clean_dir, lib, python, timeout_s=30.0)  # a mutated loop can spin forever
            finally:
                with open(target, "w", encoding="utf-8") as f:
                    f.write(clean)

        candidates = find_sites(lib.module, clean)
        bugs = select_bugs(candidates, baseline, run, seed=seed, count=count, max_tries=max_tries)
        log(
            f"{lib.name} {lib.version}: {len(candidates)} candidate edits, {len(baseline.passed())} tests "
            f"pass clean, {len(bugs)} bugs kept"
        )
        rows = []
        for bug in bugs:
            buggy = apply_site(clean, bug.site)
            assert buggy is not None
            patch = gold_patch(lib.module, buggy, clean)
            tree = os.path.join(work, "buggy")
            shutil.rmtree(tree, ignore_errors=True)
            extract(sdist, tree)
            with open(os.path.join(tree, lib.module), "w", encoding="utf-8") as f:
                f.write(buggy)
            base = git_commit(tree)
            iid = instance_id(lib, bug)
            rows.append(
                {
                    "instance_id": iid,
                    "repo": f"pypi/{lib.name}",
                    "base_commit": base,
                    "patch": patch,
                    "test_patch": "",
                    "problem_statement": problem_statement(bug, lib.tests),
                    "hints_text": "",
                    "created_at": CREATED_AT,
                    "version": lib.version,
                    "FAIL_TO_PASS": json.dumps(list(bug.fail_to_pass)),
                    "PASS_TO_PASS": json.dumps(list(bug.pass_to_pass)),
                    "environment_setup_commit": base,
                    "image": image_name(iid),
                    "eval_script": eval_script(base, lib.tests, lib.pytest_args, lib.pythonpath),
                    "log_parser": "parse_log_pytest",
                    "eval_type": "pass_and_fail",
                    "provenance": {
                        "library": lib.name,
                        "version": lib.version,
                        "license": lib.license,
                        "sdist": lib.sdist,
                        "sdist_sha256": lib.sdist_sha256,
                        "source": f"https://pypi.org/project/{lib.name}/{lib.version}/",
                        "mutation": {
                            **{k: v for k, v in dataclasses.asdict(bug.site).items() if k != "index"}
                        },
                    },
                }
            )
        return rows


def cmd_build(args: argparse.Namespace) -> None:
    from concurrent.futures import ProcessPoolExecutor

    libs = [lib for lib in LIBRARIES if not args.only or lib.name in args.only]
    for lib in libs:
        fetch(lib, args.cache)  # downloads one at a time, before the workers start
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:  # each library alone: the output order is fixed
        futures = [
            pool.submit(
                build_library, lib, args.cache, args.python, args.seed, args.per_library, args.max_tries
            )
            for lib in libs
        ]
        rows = [row for f in futures for row in f.result()]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    log(f"wrote {len(rows)} instances from {len({r['repo'] for r in rows})} libraries to {args.out}")


# ---------------------------------------------------------------- images


def read_rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def library_of(row: dict) -> Library:
    prov = row["provenance"]
    return next(lib for lib in LIBRARIES if (lib.name, lib.version) == (prov["library"], prov["version"]))


def image_exists(engine: str, name: str) -> bool:
    return subprocess.run([engine, "image", "exists", name], capture_output=True).returncode == 0


def build_image(engine: str, context: str, containerfile: str, tag: str) -> None:
    with open(os.path.join(context, "Containerfile"), "w") as f:
        f.write(containerfile)
    subprocess.run(
        [engine, "build", "-q", "--pull=never", "--network=none", "-t", tag, context],
        check=True,
        capture_output=True,
    )


def env_image(lib: Library, engine: str, cache: str) -> None:
    """The library version's environment: the base image with its runtime dependencies installed
    from wheels fetched on the host (none of the libraries here has one: the image is the base
    image, labelled)."""
    if image_exists(engine, lib.env_image):
        return
    with tempfile.TemporaryDirectory(prefix="tsl-swe-env-") as ctx:
        lines = [
            f"FROM {BASE_IMAGE}",
            f'LABEL org.thundersync.library="{lib.name}" '
            f'org.thundersync.version="{lib.version}" org.thundersync.license="{lib.license}"',
        ]
        if lib.deps:
            wheels = os.path.join(ctx, "wheels")
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--only-binary=:all:",
                    "-d",
                    wheels,
                    "--python-version",
                    "3.11",
                    *lib.deps,
                ],
                check=True,
            )
            lines += [
                "COPY wheels /tmp/wheels",
                "RUN python3 -m pip install --no-index --break-system-packages /tmp/wheels/*.whl "
                "&& rm -rf /tmp/wheels",
            ]
        build_image(engine, ctx, "\n".join(lines) + "\n", lib.env_image)
    log(f"built {lib.env_image}")


def cmd_images(args: argparse.Namespace) -> None:
    if not image_exists(args.engine, BASE_IMAGE):
        raise SystemExit(f"the base image {BASE_IMAGE} is missing: scripts/build_test_image.sh")
    rows = read_rows(args.instances)
    for lib in {library_of(r) for r in rows}:
        env_image(lib, args.engine, args.cache)
    for row in rows:
        if image_exists(args.engine, row["image"]) and not args.force:
            continue
        lib = library_of(row)
        with tempfile.TemporaryDirectory(prefix="tsl-swe-img-") as ctx:
            buggy_tree(lib, row, fetch(lib, args.cache), os.path.join(ctx, "testbed"))
            build_image(
                args.engine,
                ctx,
                f"FROM {lib.env_image}\nCOPY testbed /testbed\nWORKDIR /testbed\n",
                row["image"],
            )
        log(f"built {row['image']}")


# ---------------------------------------------------------------- validate

NOTE_PATCH = (
    "diff --git a/VALIDATION_NOTE.txt b/VALIDATION_NOTE.txt\nnew file mode 100644\n"
    "--- /dev/null\n+++ b/VALIDATION_NOTE.txt\n@@ -0,0 +1 @@\n+base run: no code changed\n"
)


def validate_row(row: dict, settings, pool) -> dict:
    """One instance through SWEbenchWorkspace (open, evaluate gold / empty / note patch)."""
    from thundersync_lightning.envs.swebench.workspace import SWEbenchWorkspace

    f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
    out: dict = {"instance_id": row["instance_id"], "FAIL_TO_PASS": len(f2p), "PASS_TO_PASS": len(p2p)}
    ws = SWEbenchWorkspace(row, settings, pool)
    t0 = time.monotonic()
    seconds = {}

    def timed(name, fn, *a):
        start = time.monotonic()
        try:
            return fn(*a)
        finally:
            seconds[name] = round(time.monotonic() - start, 3)

    try:
        timed("open_s", ws.open)
        gold = timed("gold_eval_s", ws.evaluate, row["patch"])
        empty = timed("empty_eval_s", ws.evaluate, "")
        base = timed("base_eval_s", ws.evaluate, NOTE_PATCH)
    finally:
        ws.close()
    out.update(seconds)
    status = base.report.get("tests_status", {})
    out.update(
        {
            "gold_resolved": gold.resolved,
            "gold_reason": gold.reason,
            "empty_resolved": empty.resolved,
            "empty_reason": empty.reason,
            "base_resolved": base.resolved,
            "base_fail_to_pass_failing": sorted(status.get("FAIL_TO_PASS", {}).get("failure", []))
            == sorted(f2p),
            "base_pass_to_pass_passing": sorted(status.get("PASS_TO_PASS", {}).get("success", []))
            == sorted(p2p),
            "seconds": round(time.monotonic() - t0, 2),
        }
    )
    problems = []
    if not gold.resolved:
        problems.append(f"gold patch does not resolve ({gold.reason})")
    if empty.resolved:
        problems.append("empty patch resolves")
    if base.resolved or not out["base_fail_to_pass_failing"]:
        problems.append("FAIL_TO_PASS does not fail on the base")
    if not out["base_pass_to_pass_passing"]:
        problems.append("PASS_TO_PASS does not pass on the base")
    out["valid"] = not problems
    out["problems"] = problems
    return out


def cmd_validate(args: argparse.Namespace) -> None:
    from thundersync_lightning.envs.sandbox.base import SandboxLimits
    from thundersync_lightning.envs.sandbox.container import ContainerConfig
    from thundersync_lightning.envs.sandbox.uids import UidPool
    from thundersync_lightning.envs.swebench.workspace import SWEbenchSettings

    rows = read_rows(args.instances)
    settings = SWEbenchSettings(
        container=ContainerConfig(
            engine=args.engine, limits=SandboxLimits(timeout_s=120.0, nproc=256, cpus=1.0), memory="1g"
        ),
        root="/tmp/thundersync-sandboxes",
        eval_timeout_s=300.0,
        disk_bytes=256 * 1024**2,
        disk_inodes=50_000,
    )
    pool = UidPool(3_980_000, 16)

    def check(row: dict) -> dict:
        try:
            r = validate_row(row, settings, pool)
        except Exception as e:  # noqa: BLE001 - an instance that cannot be run is dropped, with the reason
            r = {"instance_id": row["instance_id"], "valid": False, "problems": [f"{type(e).__name__}: {e}"]}
        log(
            f"{r['instance_id']}: {'valid' if r['valid'] else 'DROPPED: ' + '; '.join(r['problems'])}"
            f" ({r.get('seconds', '-')} s)"
        )
        return r

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=args.jobs) as workers:  # each instance in workspaces of its own
        results = list(workers.map(check, rows))
    kept = [row for row, r in zip(rows, results) if r["valid"]]
    n = len(kept)
    summary = {
        "instances_checked": len(rows),
        "instances_valid": n,
        "libraries": sorted({r["repo"] for r in kept}),
        "gold_resolved_rate": sum(r["gold_resolved"] for r in results if r["valid"]) / max(n, 1),
        "empty_resolved_rate": sum(r["empty_resolved"] for r in results if r["valid"]) / max(n, 1),
        "dropped": {r["instance_id"]: r["problems"] for r in results if not r["valid"]},
        "how": "SWEbenchWorkspace.evaluate (podman, runc) -> swebench make_test_spec + get_eval_report",
        "instances": results,
    }
    with open(args.report, "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")
    if len(kept) < len(rows) and not args.keep_invalid:
        with open(args.instances, "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in kept)
        log(f"dropped {len(rows) - len(kept)} invalid instances from {args.instances}")
    log(
        f"valid {n}/{len(rows)}: gold resolved {summary['gold_resolved_rate']:.0%}, "
        f"empty resolved {summary['empty_resolved_rate']:.0%}; report {args.report}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default="configs/data/swe_cpu_instances.jsonl")
    b.add_argument("--only", nargs="*", help="library names (default: all)")
    b.add_argument("--per-library", type=int, default=7)
    b.add_argument("--max-tries", type=int, default=60)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--jobs", type=int, default=3, help="libraries built at once")
    b.add_argument("--python", default="/usr/bin/python3", help="the interpreter with pytest the image has")
    for s in (sub.add_parser("images"), sub.add_parser("validate")):
        s.add_argument("--instances", default="configs/data/swe_cpu_instances.jsonl")
        s.add_argument("--engine", default="podman")
    sub.choices["images"].add_argument("--force", action="store_true")
    sub.choices["validate"].add_argument("--report", default="configs/data/swe_cpu_validation.json")
    sub.choices["validate"].add_argument("--keep-invalid", action="store_true")
    sub.choices["validate"].add_argument("--jobs", type=int, default=2, help="instances validated at once")
    for s in sub.choices.values():
        s.add_argument("--cache", default=os.path.expanduser("~/.cache/thundersync/sdists"))
    args = p.parse_args(argv)
    {"build": cmd_build, "images": cmd_images, "validate": cmd_validate}[args.command](args)


if __name__ == "__main__":
    main()
