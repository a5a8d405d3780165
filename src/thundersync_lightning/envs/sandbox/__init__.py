"""Sandboxes for untrusted agent code: bubblewrap (local tasks) and podman/docker (SWE-bench images)."""

from .base import RunGuard, Sandbox, SandboxError, SandboxLimits, SandboxResult, run_bounded
from .bwrap import BwrapConfig, BwrapSandbox, bwrap_available, chown_tree
from .container import ContainerConfig, ContainerSandbox, copy_from_image, find_engine, image_exists
from .uids import UidLease, UidPool

__all__ = [
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
    "ContainerConfig",
    "ContainerSandbox",
    "copy_from_image",
    "find_engine",
    "image_exists",
    "UidLease",
    "UidPool",
]
