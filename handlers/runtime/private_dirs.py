"""Folders only this user can write: where unpacked archives, the compile cache and the live
workers' files are kept.

The temp dir is shared by every local user, and what these folders hold is run (an archive's
handler file) or unpickled (inductor's cache entries). A user who made such a folder first could
have this server run their code, so a folder is used only if it is this user's own (not a symbolic
link) and no one else may write into it. The temp-dir ones sit in `<tmp>/hfserve-<uid>/`, made 0700.
"""

import os
import stat
import tempfile
from pathlib import Path

TEMP = Path(tempfile.gettempdir()) / f"hfserve-{os.getuid()}"


class NotPrivateError(PermissionError):
    """A folder that someone else owns or may write into: refused, never used."""


def private_folder(path: Path) -> Path:
    """`path`, made 0700 if missing; NotPrivateError, saying what to do, unless it is this user's
    own folder and not writable by group or others. A folder in TEMP has TEMP checked too."""
    path = Path(path)
    if path != TEMP and path.is_relative_to(TEMP):
        private_folder(TEMP)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = _problem(os.lstat(path))
    if problem:
        raise NotPrivateError(
            f"{path} {problem}, so another user may have put files there for this server to run: "
            "remove it (or use a folder of your own: TMPDIR, or HFSERVE_CACHE_DIR for the compile cache) "
            "and start again"
        )
    return path


def _problem(info: os.stat_result) -> str | None:
    """Why a folder with this lstat is not private, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link (name the folder it points to instead)"
    if info.st_uid != os.getuid():
        return f"is owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return None
