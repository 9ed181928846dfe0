"""A `.mar` our build made, opened outside TorchServe (Ray Serve replicas, Ray Data actors).

TorchServe unpacks an archive into a temporary folder per worker; here each machine unpacks it
once, into a folder named by the archive's digest in the user's own folder of the temp dir
(`<tmp>/hfserve-<uid>/archives`, handlers/runtime/private_dirs.py: an unpacked folder is trusted and
its handler file run, so no other user may have made it), so every replica and actor of that machine
shares the copy (and a new build of the same name is a new folder). The archive's
MANIFEST.json names the handler file and the model-config.yaml. Which task serves it is read from
the model-config.yaml (`handler.task`), so a server other than TorchServe never imports TorchServe;
only an archive built with a handler file of its own (`hfserve build --handler`, a subclass of the
TorchServe adapter) has its worker class read from that file, which needs TorchServe.
"""

import ast
import dataclasses
import importlib.util
import inspect
import json
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import yaml

from ts_compiled_handlers.compiling import compile_cache
from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.configuration.placement import Placement
from ts_compiled_handlers.runtime import package_files, private_dirs
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.tasks.registry import task_class
from ts_compiled_handlers.worker.worker import Worker

UNPACKED = private_dirs.TEMP / "archives"


class ArchiveError(ValueError):
    """An archive that cannot be served: not found, not a .mar, or not one our build made."""


@dataclasses.dataclass(frozen=True)
class Archive:
    """An unpacked archive: its folder, the manifest's model name, version and handler file, and
    its model-config.yaml."""

    folder: Path
    model_name: str
    model_version: str
    handler_file: str
    yaml_config: dict

    @classmethod
    def open(cls, path: str | os.PathLike, root: Path = UNPACKED) -> "Archive":
        """The archive at `path` (a `.mar`, or a folder already unpacked), unpacked on this machine."""
        path = Path(path).expanduser()
        if path.is_dir():
            return cls.read(path)
        if not path.is_file():
            raise ArchiveError(
                f"no archive at {path} on this machine ({os.uname().nodename}): every node "
                "that runs a replica must read the same path (docs/scale-out.md)"
            )
        if not zipfile.is_zipfile(path):
            raise ArchiveError(f"{path} is not a .mar (a zip file): build one with `hfserve build`")
        try:
            root = private_dirs.private_folder(root)
        except private_dirs.NotPrivateError as error:
            raise ArchiveError(f"{path} is not unpacked: {error}") from error
        folder = root / compile_cache.file_digest(path)[:20]
        if not folder.is_dir():
            unpack(path, folder)
        return cls.read(folder)

    @classmethod
    def read(cls, folder: Path) -> "Archive":
        try:
            model = json.loads((folder / "MAR-INF" / "MANIFEST.json").read_text())["model"]
        except (OSError, KeyError, ValueError) as error:
            raise ArchiveError(f"{folder} has no readable MAR-INF/MANIFEST.json: {error}") from error
        config_file = model.get("configFile")
        yaml_config = yaml.safe_load((folder / config_file).read_text()) if config_file else {}
        return cls(folder, model["modelName"], model.get("modelVersion", "1.0"), model["handler"], yaml_config or {})

    def served_by(self) -> tuple[type[Task], type[Worker]]:
        """The task and worker classes that serve this archive: its `handler.task`'s and our worker
        where its handler file is one of ours, else those the handler class the file defines names."""
        config = parse(self.yaml_config)
        if is_stock_handler(self.folder / self.handler_file):
            return task_class(config.task), Worker
        handler = self.handler_class()
        return handler.served_task(config), handler.worker_class

    def handler_class(self):
        """The handler class the manifest names: the one class of its file that subclasses ours."""
        from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler

        path = self.folder / self.handler_file
        spec = importlib.util.spec_from_file_location(f"archive_handler_{path.parent.name}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found = [
            value
            for value in vars(module).values()
            if inspect.isclass(value) and issubclass(value, TorchServeHandler) and value.__module__ == module.__name__
        ]
        if len(found) != 1:
            raise ArchiveError(f"{self.handler_file} must define one subclass of TorchServeHandler, not {len(found)}")
        return found[0]

    def placement(self, yaml_config: dict, name: str | None = None, gpu_id: int | None = None, **how) -> Placement:
        """Where a worker of this archive sits, under `name` (default: the archive's), with the
        model-config.yaml a server adapted (`yaml_config`) and how the server hands it requests
        (`how`: Placement's `one_at_a_time`, `continuous`)."""
        return Placement(self.folder, name or self.model_name, yaml_config, self.model_version, None, gpu_id, **how)


def is_stock_handler(path: Path) -> bool:
    """A handler file as `hfserve build` writes one (any version): imports and calls, then one class
    whose body says nothing (today's) or only names its task (`task_class = ...`, before there was
    one handler for every task). Anything else is a user's own handler."""
    try:
        body = ast.parse(path.read_text()).body
    except (OSError, SyntaxError, ValueError):
        return False
    body = [node for node in body if not isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr))]
    if len(body) != 1 or not isinstance(body[0], ast.ClassDef):
        return False
    statements = [node for node in body[0].body if not isinstance(node, ast.Expr)]
    return len(statements) <= 1 and all(ast.unparse(each).startswith("task_class = ") for each in statements)


def show_worker_logs() -> None:
    """Ray's worker processes give the root logger no handler, so only warnings reach stderr (Python's
    last resort): this package's INFO lines (the ready line, the worker's settings) go to stderr
    too, which Ray keeps in the worker's log and shows at the driver, as TorchServe's model log does."""
    ours = logging.getLogger(package_files.NAME)
    ours.setLevel(logging.INFO)
    if not ours.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        ours.addHandler(handler)


def with_threads(yaml_config: dict, cpus: float | None) -> dict:
    """The model-config.yaml with `cpus` (what Ray gave a replica or actor) as the worker's threads,
    unless it fixes them itself."""
    handler = yaml_config.get("handler") or {}
    if not cpus or "threads" in handler:
        return yaml_config
    return {**yaml_config, "handler": {**handler, "threads": max(1, int(cpus))}}


def unpack(path: Path, folder: Path) -> None:
    """Unpack next to `folder`, then rename: replicas that start together on one machine never
    read a half-written copy (the one that loses the race drops its own)."""
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if Path(member).is_absolute() or ".." in Path(member).parts:
                    raise ArchiveError(f"{path} holds a path outside the archive: {member}")
            archive.extractall(partial)
        os.replace(partial, folder)
    except OSError:
        if not folder.is_dir():
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
