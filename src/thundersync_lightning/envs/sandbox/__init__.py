"""Sandboxes for untrusted agent code: bubblewrap (local tasks) and podman/docker (SWE-bench images).

Threat model and what each backend enforces on which host: docs/security.md.
"""

from .base import (
    InvalidCommand,
    RunGuard,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    check_command,
    run_bounded,
)
from .bwrap import BwrapConfig, BwrapSandbox, bwrap_available, chown_tree
from .cgroups import CgroupSupport, CommandCgroup
from .container import ContainerConfig, ContainerSandbox, copy_from_image, find_engine, image_exists
from .fs import BoundedDir, remove_tree, sweep_stale
from .seccomp import DENIED_SYSCALLS, build_filter
from .uids import UidLease, UidPool

__all__ = [
    "InvalidCommand",
    "check_command",
    "RunGuard",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "run_bounded",
    "BwrapConfig",
    "BwrapSandbox",
    "bwrap_available",
    "chown_tree",
    "CgroupSupport",
    "CommandCgroup",
    "BoundedDir",
    "remove_tree",
    "sweep_stale",
    "DENIED_SYSCALLS",
    "build_filter",
    "ContainerConfig",
    "ContainerSandbox",
    "copy_from_image",
    "find_engine",
    "image_exists",
    "UidLease",
    "UidPool",
]
