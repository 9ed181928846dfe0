"""Compile a staged archive's model in a fresh process set up like a worker: an AOT package or a cache.

    python -m ts_compiled_handlers.scripts.precompile STAGING_DIR RESULT.json HANDLER_FILE KIND   # KIND: aot | cache

`build_mar.py --precompile` runs this as a subprocess: a new interpreter imports the archive's
handler (the package's serving files are staged as copies of this installed package's, so the
digest in the manifest is that of the served code) and reads the same model-config.yaml.
- aot: loads the model as `initialize` does, exports and compiles it with AOTInductor into
  STAGING_DIR/aot_package/, then runs the handler's own `initialize`, which must serve from that
  package (its warm-up and its check against the recorded eager answers), as a worker on this host
  will, and then the whole grid and the full check against the eager model.
- cache: runs `initialize` against an empty host cache, so what gets packed into
  STAGING_DIR/compile_cache/ is what a worker compiles.
The timings go to RESULT.json.
"""

import importlib
import inspect
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml


class ProgressBar:
    """`precompiling [#####.....] 5/10 shapes, 12 s` on stderr; one line per shape off a terminal."""

    def __init__(self, width: int = 30, stream=sys.stderr):
        self.width = width
        self.stream = stream
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // total
        bar = "#" * filled + "." * (self.width - filled)
        text = f"precompiling [{bar}] {done}/{total} shapes, {time.perf_counter() - self.started:.0f} s"
        terminal = self.stream.isatty()
        end = "\n" if done == total or not terminal else ""
        self.stream.write(("\r" if terminal else "") + text + end)
        self.stream.flush()


def handler_class(handler_file: str):
    """The handler class the archive serves: a module of the installed package (the staged files
    are copies of it) or a user's handler file at the archive's root (see `main`)."""
    module = importlib.import_module(".".join(Path(handler_file).with_suffix("").parts))
    from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler

    classes = [
        value
        for value in vars(module).values()
        if inspect.isclass(value) and issubclass(value, TorchServeHandler) and value.__module__ == module.__name__
    ]
    return classes[0]


def worker_context(staging: Path, config: dict):
    """A TorchServe Context as a worker gets it for this archive."""
    import torch
    from ts.context import Context

    gpu = 0 if torch.cuda.is_available() else None
    manifest = {"model": {"modelName": "precompile"}}
    batch_size = config.get("batchSize", 1)
    return Context("precompile", str(staging), manifest, batch_size, gpu, "0.12.0", model_yaml_config=config)


def precompile_cache(staging: Path, handler_file: str) -> dict:
    """Initialize the handler against an empty host cache and pack what it compiled."""
    from ts_compiled_handlers.compiling import compile_cache

    config = yaml.safe_load((staging / "model-config.yaml").read_text())
    handler = handler_class(handler_file)()
    handler.warmup_progress = ProgressBar()
    started = time.perf_counter()
    handler.initialize(worker_context(staging, config))
    seconds = time.perf_counter() - started
    compiled, source = handler.engine.model.is_compiled, handler.started.cache_source
    host_cache = handler.started.host_cache
    if not compiled or source != "compiled" or host_cache.failure:  # a failure is logged with its reason
        raise RuntimeError(f"nothing to pack: compiled={compiled}, cache {source}, see the log")
    built = {"initialize_seconds": round(seconds, 1), "graphs": handler.started.report.graphs}
    compile_cache.pack(host_cache.published, host_cache.valid_for, staging / compile_cache.PACKED_DIR, built)
    return {**built, "valid_for": host_cache.valid_for}


def precompile_package(staging: Path, handler_file: str) -> dict:
    """Build the AOT package, then start a handler from it as a worker would: it must serve from it;
    then run the whole grid and the full compiled-vs-eager check through it (a worker runs less)."""
    from ts_compiled_handlers.configuration.config import parse
    from ts_compiled_handlers.startup import aot_start, build_steps

    config = yaml.safe_load((staging / "model-config.yaml").read_text())
    from ts_compiled_handlers.configuration.placement import Placement

    context = worker_context(staging, config)
    served = handler_class(handler_file)
    placement = Placement(staging, "precompile", config, batch_size=context.system_properties.get("batch_size"))
    task, serving, _ = served.worker_class.read(placement, served.served_task(parse(config)))
    eager = build_steps.eager_engine(task, serving)
    print("precompile: exporting the model and compiling it with AOTInductor", file=sys.stderr, flush=True)
    built = aot_start.build_package(task, serving, eager)
    valid_for = aot_start.package_manifest(serving, eager.dtype)
    int8_module = eager.model.eager if eager.model.int8_gate is not None else None  # the unquantized one would differ
    del task, eager
    served = handler_class(handler_file)()
    started = time.perf_counter()
    served.initialize(context)
    seconds = time.perf_counter() - started
    if served.model_source != "aot package":
        raise RuntimeError(
            f"the AOT package was built but a worker here serves from {served.model_source}: see the log"
        )
    unpackaged = {name: source for name, source in served.worker.task.side_sources().items() if source != "aot package"}
    if unpackaged:
        raise RuntimeError(f"the AOT packages were built but a worker here serves {unpackaged}: see the log")
    aot_start.check_package_everywhere(served.engine, served.serving, ProgressBar(), int8_module)
    return {**built, "initialize_seconds": round(seconds, 1), "valid_for": valid_for}


PRECOMPILERS = {"aot": precompile_package, "cache": precompile_cache}


def main(argv=None) -> None:
    staging, result, handler_file, kind = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="precompile: %(levelname)s %(name)s: %(message)s")
    # The archive's root is importable, as TorchServe makes a worker's model folder: a user's
    # handler file sits there. Our package's modules there are copies of the installed ones.
    sys.path.insert(0, staging)
    with tempfile.TemporaryDirectory() as root:
        os.environ["HFSERVE_CACHE_DIR"] = root  # an empty host cache: nothing is reused
        outcome = PRECOMPILERS[kind](Path(staging), handler_file)
    Path(result).write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
