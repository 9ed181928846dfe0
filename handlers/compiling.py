"""Compile policy: how the model is compiled, and the guard that keeps live traffic from compiling.

Before `mark_ready()` the compiled model may compile (warm-up drives it over the whole grid).
After it, every call runs under `set_stance("fail_on_recompile")`: a shape that would need a new
graph raises instead of stalling a request for seconds. That event is counted
(`recompiles_after_ready`), logged once, and the group is answered by the eager model. The
`eager_on_recompile` stance would hide the event from dynamo's counters, so it is not used.
"""

import logging

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from handlers.config import CompileConfig

logger = logging.getLogger(__name__)

RECOMPILE_MESSAGE = "Detected recompile when torch.compile stance is 'fail_on_recompile'"


def compiled_graph_count() -> int:
    """Graphs dynamo has compiled in this process (one model per worker process)."""
    return counters["stats"]["unique_graphs"]


class CompiledModel:
    """The eager module, its compiled form, and the switch between them."""

    def __init__(self, model: torch.nn.Module, options: CompileConfig, graphs_needed: int):
        """Nothing is compiled until `compile()`, so its failure follows the on_failure policy."""
        self.eager = model
        self.options = options
        self.compiled = None
        self.ready = False
        self.recompiles_after_ready = 0
        self.graphs_needed = graphs_needed

    def compile(self) -> None:
        """Wrap the model with torch.compile (lazy: graphs are built by the first calls)."""
        if not self.options.enable:
            return
        # Dynamo silently falls back to eager past `recompile_limit` graphs per code object.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, self.graphs_needed)
        # dynamic=False: only the dimensions the bucket plan marks dynamic may vary, so an
        # unplanned shape is a real recompile that the guard below can see and count.
        self.compiled = torch.compile(
            self.eager,
            backend=self.options.backend,
            mode=None if self.options.mode == "default" else self.options.mode,
            fullgraph=self.options.fullgraph,
            dynamic=False,
        )

    @property
    def is_compiled(self) -> bool:
        return self.compiled is not None

    def fall_back_to_eager(self, reason: str) -> None:
        """Serve eagerly from now on; the caller has already logged why."""
        logger.error("Serving the model EAGERLY (compilation off): %s", reason)
        self.compiled = None

    def mark_ready(self) -> None:
        self.ready = True

    def __call__(self, inputs: dict) -> torch.Tensor:
        if self.compiled is None:
            return self.eager(**inputs)
        if not self.ready:
            return self.compiled(**inputs)
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self.compiled(**inputs)
        except RuntimeError as error:
            if RECOMPILE_MESSAGE not in str(error):
                raise
        self.recompiles_after_ready += 1
        if self.recompiles_after_ready == 1:
            shapes = {name: tuple(value.shape) for name, value in inputs.items() if isinstance(value, torch.Tensor)}
            logger.warning(
                "A shape outside the warm-up grid reached the compiled model after ready %s; "
                "answered eagerly and counted in RecompilesAfterReady (logged once)",
                shapes,
            )
        return self.eager(**inputs)
