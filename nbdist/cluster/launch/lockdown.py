"""Owner-only files for a cluster: `private_dirs` before it starts, `private_files` after.

ipyparallel writes the cluster's connection files (with the key that signs every message) and
its logs under the profile directory (`security/`, `log/`). Their folders are made readable by
their owner only before anything is written (0700), and the files of this cluster 0600 once
it has started. The controller also runs with umask 077 (`_controller_main`), so the
connection files it writes are owner-only from the start.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> [oct(os.stat(d).st_mode & 0o777) for d in private_dirs(folder)]
    ['0o700', '0o700']
"""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["SUBDIRS", "private_dirs", "private_files"]

SUBDIRS = ("security", "log")
"""The profile's folders that hold connection files, keys and logs."""


def private_dirs(profile_dir: str) -> list[str]:
    """Create the profile's `security/` and `log/` folders if needed, and make them 0700."""
    made = []
    for name in SUBDIRS:
        path = os.path.join(profile_dir, name)
        os.makedirs(path, mode=0o700, exist_ok=True)
        with contextlib.suppress(OSError):
            os.chmod(path, stat.S_IRWXU)
        made.append(path)
    return made


def private_files(profile_dir: str, cluster_id: str) -> list[str]:
    """Make this cluster's files in `security/` and `log/` 0600; the paths changed."""
    changed = []
    for name in SUBDIRS:
        folder = os.path.join(profile_dir, name)
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                if cluster_id not in entry.name or not entry.is_file(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError):
                    if entry.stat().st_mode & 0o077:
                        os.chmod(entry.path, stat.S_IRUSR | stat.S_IWUSR)
                        changed.append(entry.path)
    return changed
