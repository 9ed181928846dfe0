"""What a start will cost, planned from the model's FLOPs before it runs.

A start runs the model over the warm-up grid (compiled, each shape with and without padding, as
`warmup.iterations` says) and eagerly over the probe for its checks (float32 beside the served
dtype for `dtype: auto`, the packed rows for packing; the compiled rows once more against them).
On a long-context model these passes, not compiling, take most of the start, and they grow with the
square of the limit on full-attention layers. So the build sizes `startupTimeout` from this plan,
and the worker logs it before it starts and beside the real seconds once ready.

A text of L tokens costs 2 x (the weights of its linear layers) x L, plus 4 x L x keys x width per
layer for attention (keys: L on a full layer, the 2 x window + 1 a sliding layer reaches). The
rate is a matmul of the model's own width timed on this host at the dtype, times `EFFICIENCY`:
what a start's passes reach of it (measured: docs/performance.md, "Long-context start").
"""

import dataclasses
import functools
import json
import logging
import struct
import time
from pathlib import Path

import torch

from ts_compiled_handlers.configuration.config import GENERATION
from ts_compiled_handlers.engine import buckets

logger = logging.getLogger(__name__)

# What a start's passes reach of a matmul's rate, per dtype: measured on a ModernBERT-base-shaped
# model's start (8192 positions, 2026-12-07, AVX512-BF16, 2 cores), whose passes ran at 0.39-0.43 of
# the bfloat16 matmul and 0.68 of the float32 one (attention's kernels lag the matmul's more in
# bfloat16); a little under, since a start planned short fails its registration.
EFFICIENCY = {torch.float32: 0.6, torch.bfloat16: 0.35, torch.float16: 0.35}
# Compile seconds ~ FIXED + graphs x (PER_GRAPH + PER_LAYER x compiled layers), fitted on MiniLM's
# whole-model and regional compile times on 2 CPU cores (docs/design.md, "Cold start and AOT packages").
COMPILE_FIXED_SECONDS = 15
COMPILE_PER_GRAPH_SECONDS = 2
COMPILE_PER_LAYER_SECONDS = 4
# What a model's configuration or files may raise where they do not give its FLOPs (a plan only informs)
UNPLANNED = (AttributeError, KeyError, TypeError, ValueError, OSError)
CALL_SECONDS = 0.002  # what one model call costs beyond its FLOPs (Python, dispatch), eager or compiled
SAMPLE_TOKENS = 2048  # the rows of the timed matmul


@dataclasses.dataclass(frozen=True)
class StartPlan:
    """FLOPs and calls of a start's passes, and the rates they run at here."""

    compile_seconds: float
    compiled_flop: float  # the grid's passes and the compiled rows of the check, at the served dtype
    eager_flop: dict[torch.dtype, float]  # the checks' eager passes, per dtype
    calls: int
    rates: dict[torch.dtype, float]  # FLOP/s a model call reaches here, per dtype
    served: torch.dtype

    @property
    def run_seconds(self) -> float:
        """The passes' seconds, compiling aside."""
        seconds = self.compiled_flop / self.rates[self.served]
        seconds += sum(flop / self.rates[dtype] for dtype, flop in self.eager_flop.items())
        return seconds + self.calls * CALL_SECONDS

    @property
    def seconds(self) -> float:
        return self.compile_seconds + self.run_seconds

    def described(self) -> str:
        eager = sum(self.eager_flop.values())
        rates = ", ".join(f"{str(dtype).removeprefix('torch.')} {rate / 1e9:.0f}" for dtype, rate in self.rates.items())
        return (
            f"about {self.seconds:.0f} s: compiling {self.compile_seconds:.0f} s, then compiled passes "
            f"{self.compiled_flop / 1e12:.2f} TFLOP and eager checks {eager / 1e12:.2f} TFLOP in {self.calls} calls, "
            f"{self.run_seconds:.0f} s at {rates} GFLOP/s"
        )


def linear_weights(model_dir: Path) -> int:
    """Weights of the model's matrices that every token multiplies (embedding tables aside), read
    from its safetensors headers without loading them."""
    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with path.open("rb") as file:
            (size,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(size))
        for name, tensor in header.items():
            shape = tensor.get("shape", []) if isinstance(tensor, dict) else []
            if len(shape) == 2 and "embed" not in name and not name.startswith("lm_head"):
                total += shape[0] * shape[1]
    return total


def text_flop(model_config, weights: int, length: int) -> float:
    """FLOPs of one text of `length` tokens (padding included): its linears and its attention."""
    text = model_config.get_text_config()
    heads = text.num_attention_heads
    width = heads * (getattr(text, "head_dim", None) or text.hidden_size // heads)
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    window = getattr(text, "sliding_window", None) or length
    keys = [min(length, 2 * window + 1) if kind == "sliding_attention" else length for kind in layer_types]
    return 2.0 * weights * length + 4.0 * length * width * sum(keys)


def plan_start(model_config, weights: int, plan: buckets.BucketPlan, probe: list[int], passes: dict) -> dict:
    """The FLOPs and calls of a start's passes: the grid `passes["grid"]` times (iterations x
    padding variants), the probe's texts (`probe`: their lengths, each padded to its bucket) once
    compiled and `passes[dtype]` times eagerly at each dtype."""
    grid = sum(rows * text_flop(model_config, weights, length) for rows, length in buckets.warmup_shapes(plan))
    probed = sum(text_flop(model_config, weights, buckets.seq_bucket(length, plan.seq_lens)) for length in probe)
    eager = {dtype: count * probed for dtype, count in passes.items() if dtype != "grid"}
    calls = len(buckets.warmup_shapes(plan)) * passes["grid"] + len(probe) * (1 + sum(passes.values()) - passes["grid"])
    return {"compiled_flop": grid * passes["grid"] + probed, "eager_flop": eager, "calls": calls}


def start_passes(config, packs: bool, served: torch.dtype) -> dict:
    """How many times a start runs the grid, and the probe eagerly at each dtype, for this configuration."""
    passes = {"grid": 2 * config.warmup.iterations, served: 1 + packs}  # padding variants; groups, packed rows
    if config.dtype == "auto" and served != torch.float32 and config.warmup.verify:
        passes[torch.float32] = 1  # the reference `auto` checks its pick against
    return passes


def measured_rates(width: int, dtypes) -> dict[torch.dtype, float]:
    """FLOP/s a model call reaches here, per dtype: a (SAMPLE_TOKENS x width) x (width x 3 width)
    matmul timed, times the dtype's EFFICIENCY."""
    return {dtype: EFFICIENCY[dtype] * _matmul_rate(width, dtype) for dtype in dtypes}


@functools.cache  # once per process: the host does not change between its workers' starts
def _matmul_rate(width: int, dtype: torch.dtype) -> float:
    left, right = torch.randn(SAMPLE_TOKENS, width, dtype=dtype), torch.randn(width, 3 * width, dtype=dtype)
    left @ right  # the first call sets up the kernel
    seconds = min(_matmul_seconds(left, right) for _ in range(5))  # the best: a neighbour slows single calls
    return 2 * SAMPLE_TOKENS * width * 3 * width / seconds


def compile_seconds(config, plan: buckets.BucketPlan, model_config) -> float:
    """Compiling the grid's graphs (0 where compiling is off)."""
    options = config.compile
    if not options.enable:
        return 0.0
    # Regional graphs of length groups come twice, with and without an attention mask (see
    # warmup.padding_variants); packed rows always carry one. The estimate takes the larger.
    graphs = buckets.expected_graphs(plan) * (2 if options.regional else 1)
    if config.task == GENERATION:  # one decode-step graph per batch bucket; the prefill is eager
        graphs = len(plan.batch_sizes)
    layers = 1 if options.regional else model_config.get_text_config().num_hidden_layers
    return COMPILE_FIXED_SECONDS + graphs * (COMPILE_PER_GRAPH_SECONDS + COMPILE_PER_LAYER_SECONDS * layers)


def planned(config, model_dir: Path, plan: buckets.BucketPlan, probe: list[list[int]], model_config) -> StartPlan:
    """The plan of a start of this model with this configuration, its rates measured here."""
    from ts_compiled_handlers.runtime import hardware

    served = hardware.serving_dtype(config.dtype, lambda picked: False)  # `auto`'s pick, before its check
    passes = start_passes(config, plan.pack_tokens is not None, served)
    flop = plan_start(model_config, linear_weights(model_dir), plan, [len(row) for row in probe], passes)
    rates = measured_rates(model_config.get_text_config().hidden_size, [dtype for dtype in passes if dtype != "grid"])
    return StartPlan(compile_seconds(config, plan, model_config), **flop, rates=rates, served=served)


def logged_plan(serving) -> StartPlan | None:
    """The worker's plan of its start, logged before it starts; None on a GPU (the plan's rates are
    the CPU's) and, said, where the model's configuration or files do not give one (a plan only
    informs)."""
    if serving.device.type != "cpu":  # its rates are the CPU's matmuls
        return None
    probe = serving.probes.check_rows()
    try:
        plan = planned(serving.config, serving.model_dir, serving.plan, probe, serving.model_config)
    except UNPLANNED as error:
        why = f"{type(error).__name__}: {error}"
        logger.warning("Start not planned (the model's configuration gives no FLOPs): %s", why)
        return None
    logger.info("Start planned: %s", plan.described())
    return plan


def _matmul_seconds(left: torch.Tensor, right: torch.Tensor) -> float:
    began = time.perf_counter()
    left @ right
    return time.perf_counter() - began
