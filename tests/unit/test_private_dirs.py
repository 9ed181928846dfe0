"""Folders in the shared temp dir that another local user made first are refused, never used: an
unpacked archive's handler file is run and the live workers' folder is ours alone (the compile
cache's own checks are in test_compile_cache.py). The tests run as root, so `chown` plants a
folder of another user."""

import json
import os
import re
import shutil
import zipfile

import pytest

from ts_compiled_handlers.runtime import private_dirs
from ts_compiled_handlers.runtime.live_workers import LiveWorkers
from ts_compiled_handlers.servers.archive import Archive, ArchiveError

OTHER_UID = 12345


def planted(path, how: str):
    """A folder as another user would leave it: theirs, or writable by all."""
    path.mkdir(parents=True)
    if how == "other owner":
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        path.chmod(0o777)
    return path


def fake_archive(folder):
    """A .mar whose handler file says, when run, that it ran."""
    path = folder / "fake.mar"
    manifest = {"model": {"modelName": "fake", "handler": "handler.py"}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("handler.py", "raise SystemExit('ran')\n")
    return path


PROBLEMS = {  # as regular expressions
    "other owner": f"is owned by uid {OTHER_UID}",
    "world-writable": re.escape("is writable by other users (mode 0777)"),
}


@pytest.mark.parametrize("how", PROBLEMS)
def test_a_folder_another_user_owns_or_may_write_is_refused_saying_what_to_do(tmp_path, how):
    folder = planted(tmp_path / "shared", how)
    with pytest.raises(private_dirs.NotPrivateError, match=f"{PROBLEMS[how]}.*remove it"):
        private_dirs.private_folder(folder)


def test_a_new_folder_is_made_0700_and_a_symlink_is_refused(tmp_path):
    made = private_dirs.private_folder(tmp_path / "new" / "cache")
    assert made.stat().st_mode & 0o777 == 0o700 and made.stat().st_uid == os.getuid()
    private_dirs.private_folder(made)  # ours: used again
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(private_dirs.NotPrivateError, match="symbolic link"):
        private_dirs.private_folder(tmp_path / "link")


@pytest.mark.parametrize("how", PROBLEMS)
def test_the_per_user_temp_folder_is_checked_under_every_folder_in_it(tmp_path, monkeypatch, how):
    monkeypatch.setattr(private_dirs, "TEMP", tmp_path / "hfserve-0")
    planted(private_dirs.TEMP, how)
    with pytest.raises(private_dirs.NotPrivateError, match=PROBLEMS[how]):
        private_dirs.private_folder(private_dirs.TEMP / "archives")  # ours inside theirs: theirs to swap


@pytest.mark.parametrize("how", PROBLEMS)
def test_an_unpacked_archive_someone_else_planted_is_never_run(tmp_path, how):
    archive = fake_archive(tmp_path)
    unpacked_here = Archive.open(archive, root=tmp_path / "mine").folder
    root = planted(tmp_path / "unpacked", how)
    shutil.copytree(unpacked_here, root / unpacked_here.name)  # "already unpacked", by them
    with pytest.raises(ArchiveError, match=f"not unpacked: .*{PROBLEMS[how]}"):
        Archive.open(archive, root=root)


@pytest.mark.parametrize("how", PROBLEMS)
def test_the_live_workers_folder_is_ours_alone(tmp_path, how):
    with pytest.raises(PermissionError, match=PROBLEMS[how]):
        LiveWorkers(tmp_path / "model", root=planted(tmp_path / "workers", how))
