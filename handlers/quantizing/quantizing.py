"""`quantize: int8` (experimental, issue 57): the encoder's linears in int8 through PT2E, served only
once the compiled int8 model passes a gate against float32.

The eager engine's module is exported at a warm-up shape, dynamic in batch and length (so that an
AOT package can export the int8 module again over the plan's bounds, handlers/startup/aot_start.py),
annotated by torchao's X86InductorQuantizer (dynamic activations, per-channel weights), and
converted; inductor lowers the quantize/dequantize pairs to oneDNN's int8 kernels when the graph is
compiled with freezing (CompiledModel freezes whole CPU models by default). CPU only.

Under `int8`, the linears whose int8 would take the answers past the gate stay in floating point,
the fewest that pass, found by simulating int8 (handlers/quantizing/int8_search.py: on MiniLM, the FFN
downs of its first three layers); `int8-all` quantizes every one. Before quantizing, each int8 linear is
smoothed (SmoothQuant, `smoothing` is its alpha): its input channels divided by a scale measured on
the calibration texts and its weight's columns multiplied by it, which moves the activations' outlier
channels into the per-channel weights; in the compiled graph the division joins the activation's
quantizing kernel. What is not int8 runs at the model's dtype:
float32, or bfloat16 under autocast (`AroundInt8`) where `dtype` is bfloat16 or `auto` picks it; the
quantizer always starts from the float32 weights. Activations keep 8 bits where the CPU has VNNI (or
AMX), 7 (`reduce_range`) where it has not: there oneDNN's u8 x s8 products saturate at 8 bits, and
the compiled model drifts from the quantized reference. Ops nothing reads (BERT's pooler under mean
pooling) are removed before annotation: an unread Linear+Tanh breaks the quantizer's fusion pass.

The gate holds the int8 model against float32 on the calibration texts (handlers/startup/
calibration.py): per-text cosine (per token for per-token rows) at least `1 - warmup.tolerance`
for vectors, label agreement at least `agreement` for classifiers and taggers, pairwise rank
agreement at least `agreement` for one-score rerankers (on pairs of the texts: a reranker serves
pairs); for the eager int8 model here and for the compiled one after warm-up (build_steps.warm_up
finds the `Int8Gate` on the module). Below it, QuantizationRefused, and `compile.on_failure` decides.
"""

import contextlib
import dataclasses
import inspect
import logging
import math
import os

import torch

from ts_compiled_handlers.engine.engine import Engine
from ts_compiled_handlers.engine.runner import EagerRunner, ModelRunner
from ts_compiled_handlers.runtime import hardware

logger = logging.getLogger(__name__)

DEFAULT_TOLERANCE = 0.01  # 1 - the least cosine to float32 the gate passes
AROUND_INT8 = (torch.float32, torch.bfloat16)  # the dtypes the rest of an int8 model may run at


class QuantizationRefused(RuntimeError):
    """The int8 model's answers drift from float32's past the gate, with the figures."""


@contextlib.contextmanager
def input_ranges(module: torch.nn.Module):
    """While open, the largest magnitude per input channel that each linear sees (by name)."""
    ranges: dict[str, torch.Tensor] = {}

    def recorder(name: str):
        def record(_, args):
            seen = args[0].detach().abs().flatten(0, -2).amax(0).float()
            ranges[name] = torch.maximum(ranges[name], seen) if name in ranges else seen

        return record

    linears = {name: child for name, child in module.named_modules() if isinstance(child, torch.nn.Linear)}
    hooks = [linear.register_forward_pre_hook(recorder(name)) for name, linear in linears.items()]
    try:
        yield ranges
    finally:
        for hook in hooks:
            hook.remove()


def smoothing_scale(weight: torch.Tensor, seen: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's divisor per input channel, `max|x|^alpha / max|w|^(1 - alpha)` (float32)."""
    weight_range = weight.detach().abs().amax(0).float().clamp(min=1e-5)
    return (seen.clamp(min=1e-5) ** alpha / weight_range ** (1 - alpha)).clamp(min=1e-5)


@contextlib.contextmanager
def smoothed(module: torch.nn.Module, ranges: dict[str, torch.Tensor], alpha: float):
    """While open (for the export), each measured linear's input divided per channel by SmoothQuant's
    scale `max|x|^alpha / max|w|^(1 - alpha)` (a forward pre-hook, which the export records) and its
    weight's columns multiplied by it: the same product, easier to quantize; yields how many. On
    exit the linears are as they were: a model the gate refuses serves without the extra division.
    Each stays a Linear (tasks look for one: a classifier's head), and its smoothed weight is a new
    tensor, never the old one changed in place: that may be tied (an MLM head's to the embeddings)."""
    saved = []
    for name, seen in ranges.items():
        linear = module.get_submodule(name)
        weight = linear.weight
        scale = smoothing_scale(weight, seen, alpha).to(weight.dtype)
        linear.weight = torch.nn.Parameter(weight.detach() * scale, requires_grad=False)
        hook = linear.register_forward_pre_hook(lambda _, args, inverse=1 / scale: (args[0] * inverse, *args[1:]))
        saved.append((linear, weight, hook))
    try:
        yield len(saved)
    finally:
        for linear, weight, hook in saved:
            linear.weight = weight
            hook.remove()


class _Capture(ModelRunner):
    """Runs the eager module and keeps the last call's inputs: the example the export traces."""

    def __call__(self, inputs: dict) -> torch.Tensor:
        self.inputs = inputs
        return self.eager(**inputs)


def has_vnni() -> bool:
    """Whether the CPU multiplies u8 by s8 in 32 bits (VNNI, AMX): else int8 keeps 7-bit activations."""
    flags = hardware.read_cpu_flags(wanted=("avx512_vnni", "avx_vnni", "amx_int8"))
    return bool(flags)


def _dynamic_shapes(inputs: dict) -> dict:
    """Batch and length of each (batch, seq, ...) input free to vary, as torch.export takes them."""
    from torch.export import Dim

    return {
        name: {dim: Dim.AUTO for dim in (0, 1) if dim < value.dim()} if isinstance(value, torch.Tensor) else None
        for name, value in inputs.items()
    }


def _for_the_quantizer(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The exported graph without the ops nothing reads (BERT's pooler under mean pooling): an
    unread Linear+Tanh breaks the quantizer's fusion pass (IndexError); and without export's dtype
    assertions, which hold the float32 trace's dtypes where bfloat16 autocast runs others (SPLADE's
    head casts its logits, and the assertion after that cast failed)."""
    for node in list(graph_module.graph.nodes):
        if node.target is torch.ops.aten._assert_tensor_metadata.default:
            graph_module.graph.erase_node(node)
    graph_module.graph.eliminate_dead_code()
    graph_module.recompile()
    return graph_module


def int8_module(engine: Engine, example_rows: list[list[int]], kept: tuple[str, ...]) -> torch.nn.Module:
    """The engine's eager module with its linears in int8 but those named in `kept` (a GraphModule
    taking the same inputs)."""
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # its CUDA kernels are not used
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    module = engine.model.eager
    capture = _Capture(module)
    engine.on(capture).run(example_rows, one_per_row=True)  # one call (build_steps.export_example)
    inputs = {
        name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in capture.inputs.items()
    }  # not inference tensors
    with torch.no_grad():
        exported = torch.export.export(module, (), inputs, dynamic_shapes=_dynamic_shapes(inputs), strict=False)
    quantizer = x86.X86InductorQuantizer()
    reduce_range = not has_vnni()  # u8 x s8 without VNNI saturates at 8 bits (see above)
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config(is_dynamic=True, reduce_range=reduce_range))
    for name, child in module.named_modules():
        if isinstance(child, torch.nn.Linear) and name in kept:
            quantizer.set_module_name_qconfig(name, None)
    prepared = prepare_pt2e(_for_the_quantizer(exported.module()), quantizer)
    with torch.no_grad():
        prepared(**inputs)  # dynamic activations: one pass records the weights' observers
    return convert_pt2e(prepared)


def tolerance(config) -> float:
    """1 - the least cosine to float32 the gate passes: the archive's `warmup.tolerance`, else the default."""
    return config.warmup.tolerance or DEFAULT_TOLERANCE


@dataclasses.dataclass(frozen=True)
class GateFloors:
    """The least the gate passes: per-text cosine for vectors; the share of labels, or of pairs'
    order, kept for classifiers, taggers and rerankers."""

    cosine: float
    agreement: float


def variant(config) -> dict:
    """What makes the archive's compiled model another than its float one's, for the manifests of
    AOT packages and of this host's compile cache: int8's settings."""
    return {"quantize": config.quantize, "smoothing": config.smoothing}


def floors(config) -> GateFloors:
    """The archive's floors: `1 - warmup.tolerance` (else the default) and `agreement`."""
    return GateFloors(1 - tolerance(config), config.agreement)


@dataclasses.dataclass(frozen=True)
class GateFigures:
    """What the gate measured: its measure, the value, the floor it must reach, over how many texts
    (a reranker's, ranked by one score, are pairs)."""

    measure: str
    value: float
    floor: float
    texts: int

    def __str__(self) -> str:
        inputs = "pairs" if self.measure == "rank agreement" else "texts"
        return f"{self.measure} {self.value:.4f} over {self.texts} calibration {inputs} (floor {self.floor:.4f})"


def _least_cosine(int8_rows: list[torch.Tensor], float_rows: list[torch.Tensor]) -> float:
    """The least cosine of a text's vector, or of any token's where a row is per token (T, D): a
    ColBERT or bge-m3 answer is its tokens' vectors, and one over the whole text would average a
    token's drift (bge-m3's dense vector is its first token's) away."""
    cosines = [
        torch.nn.functional.cosine_similarity(
            a.float().reshape(-1, a.shape[-1]), b.float().reshape(-1, b.shape[-1]), dim=-1
        ).min()
        for a, b in zip(int8_rows, float_rows, strict=True)
    ]
    return torch.stack(cosines).min().item()  # NaN if any is: Python's min() would skip it


def _label_agreement(int8_rows: list[torch.Tensor], float_rows: list[torch.Tensor]) -> float:
    """The share of texts (of tokens, for per-token rows) whose best label is the same."""
    same = [torch.eq(a.argmax(-1), b.argmax(-1)).flatten() for a, b in zip(int8_rows, float_rows, strict=True)]
    return torch.cat(same).float().mean().item()


def _rank_agreement(int8_rows: list[torch.Tensor], float_rows: list[torch.Tensor]) -> float:
    """The share of text pairs a one-score model (a reranker) orders the same way."""
    a = torch.stack([row.flatten()[0] for row in int8_rows]).float()
    b = torch.stack([row.flatten()[0] for row in float_rows]).float()
    pairs = torch.triu_indices(len(a), len(a), offset=1)
    same = torch.sign(a[pairs[0]] - a[pairs[1]]) == torch.sign(b[pairs[0]] - b[pairs[1]])
    return same.float().mean().item() if same.numel() else 1.0


def figures(labels: bool, int8_rows: list[torch.Tensor], float_rows: list[torch.Tensor], floors: GateFloors):
    """The gate's figures: least per-text cosine for vectors, and for scores over labels (`labels`,
    the task's LABELS) label agreement (per token for taggers), or pairwise rank agreement for
    one-score rerankers; NaN, which no floor passes, where an int8 answer holds NaN or infinity
    (argmax and signs would not see it)."""
    texts = len(float_rows)
    if labels and float_rows[0].numel() == 1:
        found = GateFigures("rank agreement", _rank_agreement(int8_rows, float_rows), floors.agreement, texts)
    elif labels:
        found = GateFigures("label agreement", _label_agreement(int8_rows, float_rows), floors.agreement, texts)
    else:
        found = GateFigures("least cosine", _least_cosine(int8_rows, float_rows), floors.cosine, texts)
    finite = all(torch.isfinite(row).all() for row in int8_rows)
    return found if finite else dataclasses.replace(found, value=math.nan)


@dataclasses.dataclass
class Int8Gate:
    """The int8 model held against float32's answers on the calibration rows (computed once, by the
    float32 engine, so that model need not stay): the eager int8 module at quantization, the
    compiled one after warm-up (build_steps.warm_up); `last`: what it measured. A reranker's rows
    are text pairs, with their token types where the model reads them (`type_ids`)."""

    rows: list[list[int]]
    reference: list[torch.Tensor]  # float32's answers on `rows`
    labels: bool  # the task's LABELS: its answers are scores over labels
    floors: GateFloors
    last: GateFigures | None = None
    type_ids: list[list[int]] | None = None

    @classmethod
    def over(cls, float_engine: Engine, rows, labels: bool, floors: GateFloors, type_ids=None) -> "Int8Gate":
        gate = cls(rows, [], labels, floors, type_ids=type_ids)
        gate.reference = gate.answers(float_engine)
        return gate

    def answers(self, engine: Engine, picked=None) -> list[torch.Tensor]:
        """The engine's answers on the rows (those `picked`, by index), pairs with their types."""
        picked = range(len(self.rows)) if picked is None else picked
        types = None if self.type_ids is None else [self.type_ids[row] for row in picked]
        return engine.run([self.rows[row] for row in picked], type_ids=types).rows

    def check(self, engine: Engine) -> GateFigures:
        """The engine's answers on the rows against float32's; QuantizationRefused below the floor."""
        found = figures(self.labels, self.answers(engine), self.reference, self.floors)
        if not found.value >= found.floor:  # NaN included
            broken = " (an answer holds NaN or infinity)" if math.isnan(found.value) else ""
            raise QuantizationRefused(f"int8 vs float32: {found}{broken}")
        self.last = found
        return found

    def release(self) -> None:
        """Drop the rows and float32's answers once the last check is done (`last` stays)."""
        self.rows, self.reference, self.type_ids = [], [], None


def unfit(engine: Engine, dtype: torch.dtype) -> str | None:
    """Why `quantize: auto` leaves this engine as it is (None: int8 is worth trying)."""
    if engine.device.type != "cpu" or dtype not in AROUND_INT8:
        return "int8 serves float32 and bfloat16 models on the CPU"
    if not has_vnni():
        return "this CPU has neither VNNI nor AMX, where int8 gains little"
    return None


class AroundInt8(torch.nn.Module):
    """The int8 module with what stays in floating point (the kept linears, attention, norms) in
    bfloat16 under autocast: PyTorch's int8-mixed-bf16 recipe for X86InductorQuantizer, whose int8
    kernels then give bfloat16. Where bfloat16 serves, float32 around int8 would be slower than it."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype):
        super().__init__()
        self.module, self.dtype = module, dtype

    def forward(self, **inputs):
        with torch.autocast("cpu", dtype=self.dtype):
            return self.module(**inputs)

    def with_named_inputs(self) -> "AroundInt8":
        """This module with its int8 graph's parameter names, as torch.export needs them for an AOT
        package: export cannot give dynamic shapes to a `forward(**inputs)` (torch 2.13)."""

        def forward(**inputs):
            return AroundInt8.forward(self, **inputs)

        forward.__signature__ = inspect.signature(self.module.forward)
        self.forward = forward
        return self


def unquantized(engine: Engine, dtype: torch.dtype) -> Engine:
    """The float32 engine as it serves without int8: its model cast to `dtype` (in place: float32
    was kept only for the quantizer)."""
    engine.model.eager.to(dtype)
    return dataclasses.replace(engine, dtype=dtype)


def check_fit(engine: Engine, dtype: torch.dtype) -> None:
    """QuantizationRefused where int8 cannot run: off the CPU, or beside a dtype other than AROUND_INT8."""
    if engine.device.type != "cpu":
        raise QuantizationRefused(f"quantize: int8 runs on the CPU, not {engine.device.type}")
    if dtype not in AROUND_INT8:
        raise QuantizationRefused(f"quantize: int8 runs beside float32 or bfloat16, not {dtype}")


def int8_engine(
    engine: Engine, gate: Int8Gate, example_rows: list[list[int]], dtype, kept=(), smoothing=None
) -> Engine:
    """The float32 engine over its int8 module (the linears named in `kept` left out), the rest at
    `dtype`, once it passes the gate (kept on the module for warm-up); `smoothing`: (the linears'
    `input_ranges`, alpha) to smooth them with while quantizing."""
    check_fit(engine, dtype)
    with smoothed(engine.model.eager, *smoothing) if smoothing else contextlib.nullcontext():
        module = int8_module(engine, example_rows, kept)
    if dtype != torch.float32:
        module = AroundInt8(module, dtype)
    module.__dict__["int8_gate"] = gate  # in __dict__: not a submodule the compiler would see
    quantized = dataclasses.replace(engine.on(EagerRunner(module)), dtype=dtype)
    found = gate.check(quantized)
    around = str(dtype).removeprefix("torch.")
    alpha = f"smoothed at alpha {smoothing[1]}" if smoothing else "not smoothed"
    logger.info("int8: linears quantized (kept %s: %s; %s), %s", around, ", ".join(kept) or "none", alpha, found)
    return quantized
