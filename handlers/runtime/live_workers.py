"""The live workers of this worker's model, counted however their number is set, so threads can follow it.

TorchServe never tells a backend how many workers its model has (`minWorkers` is only where it
starts; `register --workers`, `scale` and restarts change it), so the workers of one model find
each other: each holds an exclusive `flock` on a file of its own in a folder named after the
model's extracted archive, which all its workers share (the folder is in this user's own folder
of the temp dir, handlers/runtime/private_dirs.py, so a read-only model folder works too). A file
whose lock can be taken belongs to a worker that is gone (the kernel drops the lock when a process
dies, even by kill -9) and is removed.
Each worker recounts at most once a second, before a batch, and re-applies `cores // workers`
threads when the count changed (`ThreadShare`, handlers/runtime/process_settings.py). Compiled kernels
follow the change because they are built with inductor's `cpp.dynamic_threads` (same module).
"""

import fcntl
import hashlib
import os
import secrets
from pathlib import Path

from ts_compiled_handlers.runtime import private_dirs

ROOT = private_dirs.TEMP / "workers"
# model folder -> this process's locked file in it: a process is one worker however many handlers it builds
_HELD: dict[Path, tuple[Path, int]] = {}


class LiveWorkers:
    """This worker's entry among the live workers of one model, and their count."""

    def __init__(self, model_dir: Path, root: Path | None = None):
        root = private_dirs.private_folder(root or ROOT)  # in a shared temp dir: only our own
        self.folder = root / hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:16]
        self.folder.mkdir(mode=0o700, exist_ok=True)
        if self.folder not in _HELD:
            # pid and a random part: a later process with this pid never takes over a stale file
            path = self.folder / f"{os.getpid()}-{secrets.token_hex(4)}.worker"
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held for this process's lifetime
            _HELD[self.folder] = (path, descriptor)
        self.path, self._descriptor = _HELD[self.folder]

    def count(self) -> int:
        """Live workers of the model, this one included; files of dead workers are removed."""
        os.utime(self._descriptor)  # in use: temp-dir cleaners leave it alone
        return 1 + sum(self._held(path) for path in self.folder.glob("*.worker") if path != self.path)

    @staticmethod
    def _held(path: Path) -> bool:
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # gone already, or not a file a worker made
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            path.unlink(missing_ok=True)  # its worker is gone (the kernel dropped its lock): removed under ours
            return False
        finally:
            os.close(descriptor)
