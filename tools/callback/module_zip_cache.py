"""Keeps the module archives that ansible-playbook builds from one run to the next.

ansible-core packs every module it sends to a node into an archive (AnsiballZ) with the
module_utils it imports, which it finds by parsing each one: about 0.3 s of controller CPU per
module, for each module a run uses. It keeps those archives only for the run itself, in that
run's own local temporary directory. This callback points that directory's ``ansiballz_cache`` at
one under the checkout's ``.cache/module-zips``, named by what the archives are built from:
ansible-core's version, the version of the ``ansible`` package that brings community.docker and
ansible.posix, and every file under the checkout's ``plugins/`` (path, size, modification time).
A changed module or module_utils therefore gets a new directory; an unchanged tree builds each
archive once. ansible-core locks each archive while it writes it, so runs side by side share a
directory safely.

Loaded by the checkout's ansible.cfg (``callback_plugins``) alone: the collection does not ship
it, and without it every run builds its archives as ansible-core does by default.
"""

from __future__ import annotations

import hashlib
import os
import time
from importlib import metadata
from pathlib import Path

from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.release import __version__ as core_version

DOCUMENTATION = """
name: module_zip_cache
type: aggregate
short_description: keep the module archives of one run for the next, named by what built them
description:
  - Points the run's ansiballz_cache at a directory under the checkout's .cache, named by
    ansible-core's version, the ansible package's version and the checkout's plugins/ files.
"""

ROOT = Path(__file__).resolve().parents[2]
KEEP = ROOT / ".cache" / "module-zips"
# Directories of other trees are removed once this old, never while a run may still use them.
STALE_AFTER_S = 24 * 3600


def cache_key(versions: dict[str, str], files: list[tuple[str, int, int]]) -> str:
    """The directory's name: the versions and every (path, size, mtime_ns), in any order."""
    digest = hashlib.sha256()
    for name in sorted(versions):
        digest.update(f"{name}={versions[name]}\n".encode())
    for path, size, mtime_ns in sorted(files):
        digest.update(f"{path}\0{size}\0{mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def plugin_files(plugins: Path) -> list[tuple[str, int, int]]:
    """(path relative to plugins/, size, mtime_ns) of every file under plugins/."""
    found = []
    for directory, dirs, names in os.walk(plugins):
        dirs[:] = [name for name in dirs if name != "__pycache__"]
        for name in names:
            path = Path(directory, name)
            info = path.stat()
            found.append((str(path.relative_to(plugins)), info.st_size, info.st_mtime_ns))
    return found


def stale_directories(keep: Path, current: str, now: float) -> list[Path]:
    """Directories under keep, other than current, unused for STALE_AFTER_S or more."""
    if not keep.is_dir():
        return []
    return [
        path
        for path in keep.iterdir()
        if path.is_dir() and path.name != current and now - path.stat().st_mtime >= STALE_AFTER_S
    ]


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_zip_cache"
    # Loaded whenever its directory is in callback_plugins, whatever callbacks_enabled lists
    # (the profiling runs of docs/deploy.md set that list from the environment).
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        key = cache_key(
            {"ansible-core": core_version, "ansible": _package_version("ansible")},
            plugin_files(ROOT / "plugins"),
        )
        kept = KEEP / key
        kept.mkdir(parents=True, exist_ok=True)
        # Its mtime tells the pruning below that a run still uses it.
        os.utime(kept)
        link = Path(C.DEFAULT_LOCAL_TMP, "ansiballz_cache")
        if not link.exists():
            link.symlink_to(kept, target_is_directory=True)
        for stale in stale_directories(KEEP, key, time.time()):
            for entry in stale.iterdir():
                entry.unlink()
            stale.rmdir()
