"""The served model behind one interface, however it is run: compiled, from an AOT package, or eagerly.

`ModelRunner(inputs)` answers one padded call. Before `mark_ready()` the fast path may do anything
it needs (compile, load); after it, an input the fast path cannot serve (a shape outside the
warmed grid, outside a package's bounds) is answered by the eager module and counted in
`recompiles_after_ready`, the first one logged with its shapes. Subclasses say only how the fast
path runs (`_fast`) and what it is called in that log line.
"""

import logging

import torch

logger = logging.getLogger(__name__)

# What `_fast` returns for an input it does not serve: the eager module answers it instead.
NOT_SERVED = object()


class ModelRunner:
    """The eager module and, in subclasses, a faster way to run it."""

    guards_thread_count = False  # whether the fast path must be traced again at a new thread count
    outside = "a shape the fast path does not serve"  # how the log line names an input it cannot take

    def __init__(self, eager: torch.nn.Module | None):
        self._eager = eager
        self.ready = False
        self.recompiles_after_ready = 0
        self.fallback = None  # why a model meant to be compiled serves eagerly (eager_fallback.Fallback)

    @property
    def eager(self) -> torch.nn.Module:
        return self._eager

    @property
    def int8_gate(self):
        """The gate an int8 module carries (handlers/quantizing/quantizing.py), else None; read without
        loading an eager module that is loaded only when needed (an AOT package's)."""
        return getattr(self._eager, "int8_gate", None)

    @property
    def is_compiled(self) -> bool:
        """Whether calls take a fast path at all (False: every call runs the eager module)."""
        return False

    def mark_ready(self) -> None:
        self.ready = True

    def fall_back_to_eager(self, fallback) -> None:
        """Serve eagerly from now on, for `fallback` (eager_fallback.Fallback); the caller has
        already logged the error."""
        self.fallback = fallback

    def _fast(self, inputs: dict) -> torch.Tensor | object:
        return NOT_SERVED

    def __call__(self, inputs: dict) -> torch.Tensor:
        if self.is_compiled:
            output = self._fast(inputs)
            if output is not NOT_SERVED:
                return output
            if self.ready:
                self._count_outside(inputs)
        return self.eager(**inputs)

    def _count_outside(self, inputs: dict) -> None:
        self.recompiles_after_ready += 1
        if self.recompiles_after_ready == 1:
            shapes = {name: tuple(value.shape) for name, value in inputs.items() if isinstance(value, torch.Tensor)}
            logger.warning(
                "After ready, %s %s; answered eagerly and counted in RecompilesAfterReady (logged once)",
                self.outside,
                shapes,
            )


class EagerRunner(ModelRunner):
    """A module run eagerly: the reference every check compares against, and `compile.enable: false`."""
