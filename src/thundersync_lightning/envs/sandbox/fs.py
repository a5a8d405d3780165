"""Host directories for sandboxes: a disk and inode budget, and removal that cannot fail on hostile trees.

Budget design: a sandbox's working directories live on their own size- and inode-limited tmpfs
(``mount -t tmpfs -o size=B,nr_inodes=N``), mounted by the host (root) at the workspace's private
directory. Writes past the budget fail with ENOSPC inside the sandbox; the pages are RAM and are
charged to the memory cgroup of the command that wrote them, so a workspace can never take more
than ``disk_bytes`` of RAM and its commands' memory limits still hold. Unmounting frees everything
at once, whatever the agent built (a million files, a 1000-deep tree). Where the host cannot mount
(no CAP_SYS_ADMIN), the directory is a plain one and the missing budget is named in a warning (or
an error when required).

Removal (:func:`remove_tree`) never recurses on the Python stack and holds one directory descriptor
at a time (so depth is bounded by neither the recursion limit, PATH_MAX nor RLIMIT_NOFILE), never
follows symlinks, and falls back to ``rm -rf --one-file-system``; it never raises.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess

from .base import SandboxError
from .uids import UidLease

__all__ = ["BoundedDir", "check_budget", "release_workdir", "remove_tree", "sweep_stale"]

log = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_iteratively(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    cur = os.open(path, _DIR_FLAGS)
    names: list[tuple[str, int, int]] = []  # the way down: (name, parent's st_dev, parent's st_ino)
    try:
        while True:
            child = None
            with os.scandir(cur) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        child = entry.name
                        break
                    os.unlink(entry.name, dir_fd=cur)
            if child is not None:
                here = os.fstat(cur)
                nxt = os.open(child, _DIR_FLAGS, dir_fd=cur)
                os.close(cur)
                cur = nxt
                names.append((child, here.st_dev, here.st_ino))
                continue
            if not names:
                break
            name, dev, ino = names.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            cur = parent
            here = os.fstat(cur)
            if (here.st_dev, here.st_ino) != (dev, ino):
                raise OSError(f"directory moved during removal below {path!r}")
            os.rmdir(name, dir_fd=cur)
    finally:
        os.close(cur)
    os.rmdir(path)


def remove_tree(path: str) -> bool:
    """Remove ``path`` and everything below it; True when it is gone. Never raises."""
    try:
        _remove_iteratively(path)
    except FileNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001 - clean-up must never raise; fall back and report
        log.debug("iterative removal of %s failed (%s); trying rm -rf", path, e)
        try:
            subprocess.run(["rm", "-rf", "--one-file-system", "--", path], capture_output=True, timeout=600)
        except Exception as e2:  # noqa: BLE001
            log.warning("could not remove %s: %s", path, e2)
    gone = not os.path.lexists(path)
    if not gone:
        log.warning("could not remove %s", path)
    return gone


def _mount(path: str, size_bytes: int, inodes: int, mode: int) -> str | None:
    """Mount a bounded tmpfs at ``path``; None on success, else why not."""
    opts = f"size={size_bytes},nr_inodes={inodes},mode={mode:o},nosuid,nodev"
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tsl-workdir", path],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited with {r.returncode}")


class BoundedDir:
    """The existing, empty directory ``path`` given a disk and inode budget (a tmpfs of its own)
    when the host allows it; :meth:`remove` removes the directory too.

    ``enforced`` says whether the budget holds; ``why_not`` says why it does not. With
    ``require=True`` a host that cannot mount raises :class:`SandboxError` instead.
    """

    def __init__(
        self, path: str, size_bytes: int, inodes: int, mode: int = 0o711, require: bool = False
    ) -> None:
        self.path = path
        self.why_not = _mount(path, size_bytes, inodes, mode)
        self.enforced = self.why_not is None
        if not self.enforced:
            os.chmod(path, mode)
        if not self.enforced and require:
            raise SandboxError(
                f"cannot give {path} a disk/inode budget (tmpfs mount failed: {self.why_not}); "
                "run as root with CAP_SYS_ADMIN, or allow unbounded workdirs"
            )

    def remove(self) -> bool:
        """Unmount (everything inside goes at once) and remove the directory. Never raises."""
        if self.enforced:
            try:
                r = subprocess.run(["umount", "-l", self.path], capture_output=True, text=True, timeout=120)
                if r.returncode == 0:
                    self.enforced = False
                else:
                    log.warning("umount %s failed: %s", self.path, r.stderr.strip())
            except Exception as e:  # noqa: BLE001
                log.warning("umount %s failed: %s", self.path, e)
        if self.enforced:  # still mounted: empty it, leave the mount point
            return False
        return remove_tree(self.path)


def check_budget(owner: str, budget: object, writable: list[str], require: bool = False) -> BoundedDir:
    """``budget`` if it is a :class:`BoundedDir` that holds every path of ``writable`` (host paths a
    sandbox writes to); else :class:`SandboxError`. With ``require``, an unenforced budget (a host
    that cannot mount) is an error too."""
    if not isinstance(budget, BoundedDir):
        raise SandboxError(
            f"{owner}: budget={budget!r} is not a BoundedDir; every sandbox needs a disk and inode "
            "budget holding its writable directories (sandbox.fs.BoundedDir), else its writes go "
            "to the host's disk unbounded"
        )
    root = os.path.realpath(budget.path)
    outside = [p for p in writable if os.path.commonpath([root, os.path.realpath(p)]) != root]
    if outside:
        raise SandboxError(
            f"{owner}: writable paths {outside} lie outside the disk budget at {budget.path!r}; "
            "make them inside it"
        )
    if require and not budget.enforced:
        raise SandboxError(f"{owner}: the disk budget at {budget.path!r} is not enforced ({budget.why_not})")
    return budget


def release_workdir(budget: BoundedDir | None, path: str | None, lease: UidLease | None) -> None:
    """Free a sandbox's work directory (its bounded mount, else the plain tree), then its uid lease.

    Never raises, and the lease is always released: a leaked lease would shrink the uid pool for
    the rest of the run.
    """
    try:
        if budget is not None:
            budget.remove()
        elif path is not None:
            remove_tree(path)
    except Exception as e:  # noqa: BLE001 - clean-up never raises
        log.warning("removing %s failed: %s", path, e)
    finally:
        if lease is not None:
            lease.release()


def sweep_stale(root: str, marker: str) -> int:
    """Unmount and remove the entries of ``root`` whose name contains ``marker``; how many.

    Workspace directories carry their uid in the name (``-u<uid>-``). A new holder of that uid's
    lease (leases are exclusive across processes) knows that every such directory was left by a
    holder that died without closing (a killed learner): its tmpfs would otherwise keep its RAM
    until reboot. Never raises.
    """
    swept = 0
    try:
        names = [n for n in os.listdir(root) if marker in n]
    except OSError:
        return 0
    for name in names:
        path = os.path.join(root, name)
        try:
            subprocess.run(["umount", "-l", path], capture_output=True, timeout=120)
        except Exception as e:  # noqa: BLE001
            log.warning("umount %s failed: %s", path, e)
        if remove_tree(path):
            swept += 1
    return swept
