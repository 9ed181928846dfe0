"""An archive's `sitecustomize.py` (`hfserve build` puts a copy at the archive's root): TorchServe
puts the model's folder on its worker's PYTHONPATH, so this runs first in the worker, before
TorchServe's own code. A worker that nobody gave an allocator starts again under tcmalloc where it
is installed (ts_compiled_handlers/runtime/allocator.py), so plain `torchserve --start` gets what `hfserve
serve` sets. Then the interpreter's own sitecustomize, which this one hides, runs as it would have."""

import importlib.machinery
import importlib.util
import os
import sys


def run_the_hidden_sitecustomize() -> None:
    """The next `sitecustomize` on the path after this folder's, if any (Debian's installs apport's hook)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if sys.argv and sys.argv[0].endswith(os.path.join("ts", "model_service_worker.py")):
    from ts_compiled_handlers.runtime import allocator

    allocator.restart_worker(sys.orig_argv, dict(os.environ))
run_the_hidden_sitecustomize()
