"""Compile policy: how the model is compiled, and the guard that keeps live traffic from compiling.

Before `mark_ready()` the compiled model may compile (warm-up drives it over the whole grid).
After it, every call runs under `set_stance("fail_on_recompile")`: a shape that would need a new
graph raises instead of stalling a request for seconds. That event is counted
(`recompiles_after_ready`), logged once, and the group is answered by the eager model. The
`eager_on_recompile` stance would hide the event from dynamo's counters, so it is not used.

Regional compilation (`compile.regional`) compiles the model's repeated block (its transformer
layer) instead of the whole model: dynamo traces and inductor compiles one layer, reused by every
layer, so compiling is faster; the code around the blocks runs eagerly.

Dynamo is imported on first use (`torch._dynamo` is one of torch's lazy modules): a worker that
serves an AOT package never compiles, and importing dynamo would cost it a second of its start.
"""

import logging
from typing import Callable

import torch

from ts_compiled_handlers.configuration.config import CompileConfig
from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.engine.runner import NOT_SERVED, ModelRunner
from ts_compiled_handlers.runtime import process_settings

logger = logging.getLogger(__name__)

RECOMPILE_MESSAGE = "Detected recompile when torch.compile stance is 'fail_on_recompile'"


def repeated_blocks(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The longest ModuleList of modules of one class: the transformer's layers."""
    lists = [
        module
        for module in model.modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1
    ]
    return max(lists, key=len, default=None)


def block_dynamic_dims(value: torch.Tensor, batch: int, seq_len: int, dynamic: str) -> list[int]:
    """Which dims of a block input vary with the bucket, by transformer convention.

    Tensors are (batch, seq, ...) like hidden states, or 4-d attention masks (batch, heads, query,
    key). Sizes alone cannot tell a length from a hidden size of the same value.
    """
    dims = [0] if value.shape[0] == batch else []
    if dynamic == "all" and seq_len > 1:
        tail = (2, 3) if value.dim() == 4 else (1,)
        dims += [dim for dim in tail if dim < value.dim() and value.shape[dim] == seq_len]
    return dims


class DynamicBlock(torch.nn.Module):
    """A compiled block whose inputs get the plan's dynamic dimensions marked, as `infer` marks the model's.

    The block's inputs are intermediate tensors, so the marks on the model's inputs do not reach them.
    """

    def __init__(self, block: torch.nn.Module, dynamic: str):
        super().__init__()
        self.block = block
        self.dynamic = dynamic

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        batch, seq_len = hidden_states.shape[:2]
        for value in (hidden_states, *args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                for dim in block_dynamic_dims(value, batch, seq_len, self.dynamic):
                    torch._dynamo.mark_dynamic(value, dim)
        return self.block(hidden_states, *args, **kwargs)


class ForceEager(torch.nn.Module):
    """Runs a module whose blocks were compiled in place as plain eager code."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        with torch.compiler.set_stance("force_eager"):
            return self.module(*args, **kwargs)


def compiled_graph_count() -> int:
    """Graphs dynamo has compiled in this process (one model per worker process)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class CompiledModel(ModelRunner):
    """The eager module and its torch.compile form; after ready, calls run under `fail_on_recompile`."""

    guards_thread_count = True  # dynamo's global-state guard covers torch.get_num_threads()
    outside = "a shape outside the warm-up grid reached the compiled model"

    def __init__(self, model: torch.nn.Module, options: CompileConfig, graphs_needed: int, task_freezes: bool = True):
        """Nothing is compiled until `compile()`, so its failure follows the on_failure policy.
        `task_freezes`: the task's graphs may be frozen (`Task.FREEZES`)."""
        super().__init__(model)
        self.options = options
        self.task_freezes = task_freezes
        self.compiled = None
        self.graphs_needed = graphs_needed
        self.graphs_per_state = graphs_needed

    def compile(self) -> None:
        """Wrap the model with torch.compile (lazy: graphs are built by the first calls)."""
        if not self.options.enable:
            return
        process_settings.configure_compiler(self.options.dynamic, self.graphs_needed, self.freezes)
        # dynamic=False: only the dimensions the bucket plan marks dynamic may vary, so an
        # unplanned shape is a real recompile that the guard below can see and count.
        options = {
            "backend": self.options.backend,
            "mode": None if self.options.mode == "default" else self.options.mode,
            "fullgraph": self.options.fullgraph,
            "dynamic": False,
        }
        if not self.options.regional:
            self.compiled = torch.compile(self._eager, **options)
            return
        blocks = repeated_blocks(self._eager)
        if blocks is None:
            raise RuntimeError(f"compile.regional: {type(self._eager).__name__} has no repeated blocks to compile")
        logger.info("Regional compile: %d x %s", len(blocks), type(blocks[0]).__name__)
        for index, block in enumerate(blocks):
            block.compile(**options)
            if self.options.dynamic != "none":
                blocks[index] = DynamicBlock(block, self.options.dynamic)
        self.compiled = self._eager
        self._eager = ForceEager(self._eager)

    @property
    def is_compiled(self) -> bool:
        return self.compiled is not None

    @property
    def freezes(self) -> bool:
        """Whether inductor freezes the weights (`compile.freezing`; auto: a whole model on the CPU,
        since a regional graph serves every block, each with weights of its own, of a task whose
        graphs may be frozen)."""
        if self.options.freezing is not None:
            return self.options.freezing
        on_cpu = all(parameter.device.type == "cpu" for parameter in self._eager.parameters())
        return on_cpu and not self.options.regional and self.task_freezes

    def fall_back_to_eager(self, fallback) -> None:
        logger.error("Serving the model EAGERLY (compilation off): %s", fallback)
        self.compiled = None
        self.fallback = fallback

    def retrace(self, run_grid: Callable[[], object]) -> None:
        """Let `run_grid` compile the grid again under a new process state (dynamo's guards cover
        the thread count), next to the graphs of the earlier states."""
        self.graphs_needed += self.graphs_per_state
        process_settings.allow_graphs(self.graphs_needed)
        self.ready = False
        try:
            run_grid()
        finally:
            self.ready = True

    def _fast(self, inputs: dict) -> torch.Tensor | object:
        if not self.ready:
            for value in inputs.values():  # the plan's varying dimensions, so one graph serves the grid
                if isinstance(value, torch.Tensor):
                    buckets.mark_dynamic_dims(value, self.options.dynamic)
            return self.compiled(**inputs)
        # Ready, the inputs go unmarked: dynamo's guard on a marking passes a tensor that has none
        # (torch/_dynamo/guards.py), and marking is torch._dynamo's Python, per input, per call.
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                return self.compiled(**inputs)
        except RuntimeError as error:
            if RECOMPILE_MESSAGE not in str(error):
                raise
        return NOT_SERVED
