"""AOT packages of the modules a task runs beside its engine (CLIP's and SigLIP's vision tower).

Each is a package like the engine's (handlers/compiling/aot_package.py), in its own folder of the
archive's, `aot_package/<name>/`, valid for what the engine's package is valid for. The task hands
over its module, example inputs whose first dimension is the batch, and the probe inputs and answers
a worker checks the package against; this room exports, compiles, finds the weights in the archive
and, in a worker, loads and checks. Tasks reach it through the object passed to their hooks, so
they never import the startup room.
"""

import functools
import logging
from pathlib import Path
from typing import Callable

import torch

from ts_compiled_handlers.compiling import aot_package

logger = logging.getLogger(__name__)


class SidePackage:
    """A loaded side package, called with the module's keyword inputs (`aot_package.run_at_least`)."""

    def __init__(self, runner: aot_package.NativePackage, constants: dict, reference: dict, min_batch: int):
        self.runner, self.constants, self.reference, self.min_batch = runner, constants, reference, min_batch

    def __call__(self, **inputs: torch.Tensor) -> torch.Tensor:
        return aot_package.run_at_least(self.runner, inputs, self.min_batch)


class SidePackages:
    """The archive's side packages for one worker or build: its folder, what they must be valid for
    (the engine package's manifest, `manifest()`, made only where a side package is built or found:
    it hashes the package's sources) and the batch range the plan needs."""

    def __init__(self, serving, manifest: Callable[[], dict]):
        self.root = Path(serving.model_dir) / aot_package.PACKAGE_DIR
        self.model_dir, self.device = Path(serving.model_dir), serving.device
        self.options, self.max_batch, self._manifest = serving.compile_options, serving.plan.max_batch, manifest

    @functools.cached_property
    def valid_for(self) -> dict:
        return self._manifest()

    def build(self, name: str, module: torch.nn.Module, row: dict, reference: dict) -> dict:
        """Export `module` over batches 1 to the plan's largest (every input's first dimension), traced
        on copies of `row` (inputs of batch one), with `reference` (probe inputs and the answers a
        worker must match); returns the build's timings."""
        from safetensors.torch import save_file
        from torch.export import Dim

        size = min(2, self.max_batch)  # a traced batch of one would be specialized on
        example = {key: value[:1].expand(size, *value.shape[1:]).contiguous() for key, value in row.items()}

        def inputs_for(min_batch: int) -> tuple[dict, dict]:
            if self.max_batch <= min_batch:
                return example, {key: {} for key in example}
            batch = Dim("batch", min=min_batch, max=self.max_batch)
            return example, {key: {0: batch} for key in example}

        program = aot_package.export_over_batches(module, inputs_for, self.max_batch)
        tensors = {key: value.contiguous() for key, value in reference.items()}
        return aot_package.write(
            program,
            module,
            self.options,
            self.valid_for,
            self.root / name,
            lambda path: save_file(tensors, str(path)),
            {},
        )

    def load(self, name: str) -> SidePackage | None:
        """The side package `name`, loaded with its weights and reference; None where the archive has
        none, and where it cannot serve this worker (the log says why)."""
        from safetensors.torch import load_file

        folder = self.root / name
        if not folder.is_dir():
            return None
        try:
            runner, constants, description = aot_package.load_native(
                folder, self.valid_for, self.model_dir, self.device
            )
            reference = load_file(str(folder / aot_package.REFERENCE_FILE))
        except Exception as error:  # PackageError says why; anything else is a defect, with its traceback
            known = isinstance(error, aot_package.PackageError)
            folder = f"{aot_package.PACKAGE_DIR}/{name}/"
            logger.warning(
                "AOT package %s IGNORED, compiling that model instead: %s", folder, error, exc_info=not known
            )
            return None
        return SidePackage(runner, constants, reference, description.get("min_batch", 1))
