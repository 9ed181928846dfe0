"""Building the engine at `initialize`: each step a function from what it needs to what it makes.

    serve_package(task, serving)      -> engine      the archive's AOT package, if it matches and passes its
                                                     check (handlers/startup/aot_start.py)
    load_model(task, serving)         -> module      the eager model at the chosen dtype (`auto` checked vs float32;
                                                     float32 where `quantize` asks for int8, which runs at that dtype)
    choose_layout(task, serving, ...) -> Engine      packed rows if packed answers equal alone ones, else groups
    compile_and_warm_up(engine, ...)  -> Started     compiled over the grid (or from the host's cache), checked

`build_engine` runs them in that order. What goes wrong is loud: a package, a packing check or a
compile that fails for a known reason logs one line saying why; anything else also logs its
traceback.
"""

import contextlib
import copy
import dataclasses
import logging
import time
from pathlib import Path

import torch

from ts_compiled_handlers.compiling import compile_cache
from ts_compiled_handlers.compiling.compiling import CompiledModel
from ts_compiled_handlers.engine import local_attention, packing, text_attention
from ts_compiled_handlers.engine.engine import Engine
from ts_compiled_handlers.engine.layout import Layout
from ts_compiled_handlers.engine.runner import EagerRunner
from ts_compiled_handlers.graphs import lora
from ts_compiled_handlers.quantizing import quantizing
from ts_compiled_handlers.runtime import hardware, process_settings
from ts_compiled_handlers.startup import aot_start, eager_fallback, warmup
from ts_compiled_handlers.startup.serving import Serving, Started
from ts_compiled_handlers.tasks import Task

logger = logging.getLogger(__name__)

# Where the compiled kernels came from, as the ready line says it (handlers/worker/ready_report.py logs it).
CACHE_SOURCES = {
    "archive": "hit, unpacked from the archive",
    "host": "hit, this host's cache from an earlier worker",
    "compiled": "miss, compiled here",
    "off": "off",
    "error": "off, this host's cache failed (the warning above says why; CompileCacheErrors counts it)",
    "aot": "not needed, the archive's AOT package serves",
}


@dataclasses.dataclass
class ProbeAnswers:
    """Eager answers on the start's probe (`serving.probes.check_rows()`) that one check computed
    and a later one needs again, so no check runs the model eagerly twice on the same rows (on a
    long-context model each pass holds a text at the limit): the length groups' at each dtype (the
    `dtype: auto` check's candidate, the packing check's reference), and the served layout's (the
    compiled-vs-eager check's reference)."""

    alone: dict[torch.dtype, list[torch.Tensor]] = dataclasses.field(default_factory=dict)
    served: list[torch.Tensor] | None = None

    def alone_at(self, engine: Engine, probe: list[list[int]]) -> list[torch.Tensor]:
        if engine.dtype not in self.alone:
            self.alone[engine.dtype] = engine.run(probe).rows
        return self.alone[engine.dtype]


class WithoutInt8(Exception):
    """The compiled int8 model failed its gate where the policy serves the model without int8."""


def build_engine(task: Task, serving: Serving, progress=None) -> tuple[Engine, Started]:
    """The engine a worker serves: from the archive's AOT package where it can, else compiled."""
    began = time.perf_counter()
    served = aot_start.serve_package(task, serving, began, progress)
    if served is None:
        try:
            served = compiled_engine(task, serving, began, progress)
        except WithoutInt8 as error:  # the compiled model's gate refused: `auto`, or `on_failure: eager`
            logger.warning("quantize: %s: the model is built again without int8: %s", serving.config.quantize, error)
            serving = dataclasses.replace(serving, config=dataclasses.replace(serving.config, quantize="none"))
            served = compiled_engine(task, serving, began, progress)
    packages = aot_start.side_packages(serving, served[0].dtype)
    task.build_side_models(serving, served[0].dtype, warmup.check_drift, packages)
    return served


def compiled_engine(task: Task, serving: Serving, began: float, progress=None) -> tuple[Engine, Started]:
    """The model loaded, compiled over the grid and warmed (eagerly where compiling fails, as
    `compile.on_failure` says)."""
    answers = ProbeAnswers()
    engine = eager_engine(task, serving, answers)
    load_seconds = time.perf_counter() - began
    graphs_needed = task.graphs_needed(serving.plan)
    engine = engine.on(CompiledModel(engine.model.eager, serving.compile_options, graphs_needed, task.FREEZES))
    return engine, compile_and_warm_up(engine, serving, load_seconds, progress, answers.served)


def eager_engine(task: Task, serving: Serving, answers: ProbeAnswers | None = None) -> Engine:
    """The model loaded at its dtype, over the layout it serves, run eagerly: what is compiled or
    exported. `answers` keeps the probe's eager answers for the checks after it."""
    answers = answers or ProbeAnswers()
    module, dtype = load_model(task, serving, answers)
    if serving.config.quantize == "none":
        engine = choose_layout(task, serving, module, dtype, answers)
        adapted = with_adapters(task, serving, engine)
        answers.served = answers.served if adapted is engine else None  # adapters answer otherwise
        return adapted
    answers.served = None  # int8's checks are against float32, through its gate
    return quantize(task, choose_layout(task, serving, module, torch.float32, answers), serving, dtype)


def with_adapters(task: Task, serving: Serving, engine: Engine) -> Engine:
    """The engine over its module with the archive's LoRA adapters attached (handlers/graphs/lora.py)
    and an `adapter_ids` input; as it is where the configuration names none. The layout was chosen,
    and checked, on the base model; an adapted head (a pooler, a classifier) needs each text at the
    start of a row, so packed rows give way to length groups then."""
    names = serving.config.adapters
    if not names:
        return engine
    adapters = lora.read_all(serving.model_dir, names)
    gate, rank, heads = lora.attach(engine.model.eager, adapters)
    if heads and engine.layout.packed:
        logger.warning("Packing OFF, texts run in length groups: the adapters adapt %s", ", ".join(heads))
        module = engine.model.eager.module  # the PackedModel's
        if engine.layout.per_text:
            text_attention.disable(module)  # plain SDPA, as length groups run
        engine = task.engine(EagerRunner(module), serving, engine.dtype, Layout())
    adapted = lora.Adapted(engine.model.eager, gate, len(adapters), rank)
    logger.info("Adapters served: %s (rank %d, %d linear layers)", ", ".join(names), rank, adapted.layers)
    return dataclasses.replace(
        engine, model=EagerRunner(adapted), layout=dataclasses.replace(engine.layout, adapters=len(adapters))
    )


def adapter_mix(engine: Engine, texts: int) -> list[int] | None:
    """Each adapter and the base model in turn over `texts` texts, where the engine serves adapters:
    so the checks compare every adapter, compiled against eager."""
    return [text % (engine.layout.adapters + 1) for text in range(texts)] if engine.layout.adapters else None


def quantize(task: Task, engine: Engine, serving: Serving, dtype: torch.dtype) -> Engine:
    """The float32 engine over its int8 module, run at `dtype` around the int8 linears, if it passes
    the gate on the calibration texts; else, for `int8`, as `compile.on_failure` says, and for
    `auto`, the model as it was (at `dtype`)."""
    from ts_compiled_handlers.quantizing import int8_search
    from ts_compiled_handlers.quantizing.calibration import calibration_pairs, calibration_rows, calibration_texts

    plan, config = serving.plan, serving.config
    unfit = quantizing.unfit(engine, dtype)
    if config.quantize == "auto" and unfit:
        logger.info("quantize: auto keeps %s: %s", str(dtype).removeprefix("torch."), unfit)
        return quantizing.unquantized(engine, dtype)
    if not quantizing.has_vnni():
        logger.warning("quantize: int8 on a CPU without VNNI or AMX: 7-bit activations, and little faster than float32")
    example = export_example(serving)
    try:
        texts = calibration_texts(config.calibration, serving.model_dir)
        inputs = task.calibration_inputs(texts, lambda: calibration_pairs(texts))
        options = task.tokenizer_options()
        rows, types = calibration_rows(serving.tokenizer, inputs, plan.max_seq_len, options, engine.layout.token_types)
        with quantizing.input_ranges(engine.model.eager) as ranges:  # in float32's pass over the texts
            gate = quantizing.Int8Gate.over(engine, rows, task.LABELS, quantizing.floors(config), types)
        kept = (
            ()
            if config.quantize == "int8-all"
            else int8_search.sensitive_linears(engine, gate, ranges, config.smoothing, dtype)
        )
        ranges = {name: seen for name, seen in ranges.items() if name not in kept}
        smoothing = (ranges, config.smoothing) if config.smoothing else None
        return quantizing.int8_engine(engine, gate, example, dtype, kept, smoothing)
    except quantizing.QuantizationRefused as error:
        if config.quantize != "auto":
            on_failure(config.compile.on_failure, error)
        logger.warning("quantize: %s keeps %s: %s", config.quantize, str(dtype).removeprefix("torch."), error)
    except Exception as error:  # the export or the quantizer failed on this model: a bug to see
        if config.quantize != "auto":
            on_failure(config.compile.on_failure, error)
        else:  # `auto` keeps the model as it is whatever stopped int8, and says why
            logger.error("quantize: auto keeps %s: int8 failed", str(dtype).removeprefix("torch."), exc_info=error)
    return quantizing.unquantized(engine, dtype)


def export_example(serving: Serving) -> list[list[int]]:
    """The texts int8's export traces, one call of them, each in a row of its own: the longest
    length whose calls hold two rows or more, as many as they hold. A call of one row would fix
    the export's batch at 1 (torch.export specializes a size of 1), and every larger call would fail
    its guard: a plan whose longest length fits one row per call (`max_tokens`) did so."""
    plan = serving.plan
    seq_len = next((length for length in reversed(plan.seq_lens) if plan.rows_for(length) >= 2), plan.seq_lens[-1])
    return serving.probes.filler(seq_len, plan.rows_for(seq_len))


def load_model(task: Task, serving: Serving, answers: ProbeAnswers) -> tuple[torch.nn.Module, torch.dtype]:
    """The eager model on the device at the chosen dtype."""
    module = task.load_model(serving.model_dir).eval().to(serving.device)
    local_attention.enable(module)  # sliding-window layers at their window's cost, in every check too
    dtype = choose_dtype(task, serving, module, answers)
    return module.to(dtype if serving.config.quantize == "none" else torch.float32), dtype


def choose_dtype(task: Task, serving: Serving, module: torch.nn.Module, answers: ProbeAnswers) -> torch.dtype:
    """The configured dtype; for `auto`, the hardware's pick if it stays close to float32 on the probe."""
    verify = serving.config.warmup.verify
    return hardware.serving_dtype(
        serving.config.dtype, lambda picked: verify and drifts(task, serving, module, picked, answers)
    )


def drifts(task: Task, serving: Serving, module: torch.nn.Module, picked: torch.dtype, answers: ProbeAnswers) -> bool:
    """Whether the eager model at `picked` drifts from float32 on the probe past its tolerance
    (said, then `compile.on_failure` followed: `fail` raises). Both answers are kept in `answers`:
    the model is cast to one of the two for good, and the same cast answers the same."""
    probe = serving.probes.check_rows()
    reference = answers.alone_at(task.engine(EagerRunner(module), serving, torch.float32, Layout()), probe)
    candidate = copy.deepcopy(module).to(picked)  # casting back to float32 would lose bits
    try:
        outputs = answers.alone_at(task.engine(EagerRunner(candidate), serving, picked, Layout()), probe)
        warmup.check_drift(f"dtype auto -> {picked}", outputs, reference, serving.tolerance(picked))
    except warmup.WarmupError as error:
        on_failure(serving.config.compile.on_failure, error)
        return True
    return False


def choose_layout(task: Task, serving: Serving, module, dtype: torch.dtype, answers: ProbeAnswers) -> Engine:
    """An eager engine over packed rows if the plan packs and, on the probe, each text packed with
    others gets the answer it gets alone (with per-text attention where it is on, else with the
    block mask); otherwise over length groups. The chosen engine's answers on the probe go to
    `answers.served`."""
    alone = task.engine(EagerRunner(module), serving, dtype, Layout())
    chosen = None
    if serving.plan.pack_tokens is not None and hasattr(module, "packed"):
        per_text = serving.config.buckets.pack_attention == "auto" and serving.device.type == "cpu"
        per_text = per_text and getattr(module, "per_text_attention", True)  # False: a mask of its own inside texts
        if per_text and text_attention.enable(module):
            refused = "Per-text attention OFF, the block mask instead"
            chosen = packed_engine(task, serving, module, (dtype, alone, answers), refused, per_text=True)
            if chosen is not None:
                logger.info("Packed rows attend per text (hfserve::text_attention)")
            else:
                text_attention.disable(module)
        refused = "Packing OFF, texts run in length groups"
        chosen = chosen or packed_engine(task, serving, module, (dtype, alone, answers), refused)
    if chosen is None:
        answers.served = answers.alone.get(dtype)  # the length groups' own, where a check computed them
        return alone
    return chosen


def packed_engine(task: Task, serving: Serving, module, against: tuple, refused: str, per_text: bool = False):
    """The engine over packed rows if its answers on the probe equal the length groups' (`against`:
    the dtype, their engine and the answers kept so far), else None, logged after `refused` with why."""
    dtype, alone, answers = against
    layout = Layout(serving.plan.pack_tokens, packing.first_position(module), per_text=per_text)
    packed = task.engine(EagerRunner(packing.PackedModel(module)), serving, dtype, layout)
    probe = serving.probes.check_rows()
    try:
        expected = answers.alone_at(alone, probe)
        together = packed.run(probe).rows
        warmup.check_drift("packed vs alone", together, expected, serving.tolerance(dtype))
        warmup.check_error("packed vs alone", together, expected, serving.tolerance(dtype) ** 0.5)
    except (warmup.WarmupError, NotImplementedError) as error:  # answers that differ, a head it cannot reach
        logger.warning("%s: %s: %s", refused, type(error).__name__, error)
        return None
    except Exception:  # a model that takes no position_ids or 4-D mask, or a defect: why, with its traceback
        logger.warning("%s: the packed model failed", refused, exc_info=True)
        return None
    logger.info("Packing on: rows of up to %d tokens, positions from %d", layout.pack_budget, layout.first_position)
    answers.served = together
    return packed


def on_failure(policy: str, error: Exception) -> None:
    """Log a failed compile or check (with its traceback unless it is a failed comparison) and
    raise it again if the policy is `fail`."""
    known = isinstance(error, (warmup.WarmupError, quantizing.QuantizationRefused))
    logger.error(
        "Compile or warm-up check failed (on_failure=%s): %s: %s",
        policy,
        type(error).__name__,
        error,
        exc_info=None if known else error,
    )
    if policy == "fail":
        raise error


def compile_and_warm_up(engine: Engine, serving: Serving, load_seconds: float, progress=None, eager=None) -> Started:
    """Compile the engine's model over the whole grid, inside the lease on this host's compile cache.
    The cache only saves time: its I/O errors (a full or read-only disk) never fail the worker, or
    TorchServe would restart it to compile and fail again (compile_cache.HostCache gives it up).
    `eager`: the engine's eager answers on the probe, where a check before computed them."""
    host_cache = _host_cache(engine, serving)
    packed_cache = serving.model_dir / compile_cache.PACKED_DIR
    with host_cache.lease(packed_cache) if host_cache else contextlib.nullcontext() as lease:
        report = warm_up(engine, serving, progress, eager)
        if lease is not None and engine.model.is_compiled:
            host_cache.publish(lease)
    compiled = engine.model.is_compiled
    if compiled:
        process_settings.stop_compile_workers()
    if engine.model.int8_gate is not None:
        engine.model.int8_gate.release()  # checked for good
    return Started(report, lease.source if lease is not None and compiled else "off", load_seconds, host_cache)


def _host_cache(engine: Engine, serving: Serving) -> compile_cache.HostCache | None:
    """This host's compile cache for the engine (None where compilation or the cache is off)."""
    option = serving.config.compile.cache_dir
    root = compile_cache.default_root() if option == "auto" else None if option == "off" else Path(option)
    if not serving.config.compile.enable or root is None:
        return None
    valid_for = compile_cache.manifest(
        hardware.detect(), engine.dtype, engine.plan, serving.compile_options, serving.model_dir
    )
    return compile_cache.HostCache(root, {**valid_for, **quantizing.variant(serving.config)})


def warm_up(engine: Engine, serving: Serving, progress=None, eager=None) -> warmup.WarmupReport:
    """Compile and run the whole grid, then check compiled answers against eager ones (`eager`,
    where a check before computed them); a failure follows `compile.on_failure` (serve eagerly, or
    fail the worker)."""
    model, config = engine.model, serving.config
    try:
        model.compile()
        check = model.graphs_needed if model.is_compiled else None
        report = warmup.run_grid(engine, config.warmup.iterations, serving.probes.filler, check, progress)
        if model.is_compiled and model.int8_gate is not None:  # judged against float32, not its q/dq reference
            model.int8_gate.check(engine)
        elif model.is_compiled and config.warmup.verify:
            probe = serving.probes.check_rows()
            mix = adapter_mix(engine, len(probe))
            if eager is None:
                eager = engine.on(EagerRunner(model.eager)).run(probe, adapters=mix).rows
            compiled = engine.run(probe, adapters=mix).rows
            warmup.check_drift("compiled vs eager", compiled, eager, serving.tolerance(engine.dtype))
        return report
    except Exception as error:  # a compile error can be of any type; all follow on_failure
        if not config.compile.enable:
            raise
        if isinstance(error, quantizing.QuantizationRefused):  # int8's compiled answers: built again without int8
            if config.quantize != "auto":
                on_failure(config.compile.on_failure, error)
            raise WithoutInt8(str(error)) from error
        on_failure(config.compile.on_failure, error)
        model.fall_back_to_eager(eager_fallback.fallback_of(error))
        report = warmup.run_grid(engine, 1, serving.probes.filler, None)
        return dataclasses.replace(report, graphs=0)


def trace_again(engine: Engine, serving: Serving, threads: int) -> None:
    """Trace the grid at a new thread count. Dynamo guards on the thread count, so without this
    every call after a re-share would count as a recompile and run eagerly. The kernels come from
    inductor's cache (built with dynamic threads, they do not change); dynamo keeps the graphs of
    every count it has seen."""
    began = time.perf_counter()
    try:
        engine.model.retrace(lambda: warmup.run_grid(engine, 1, serving.probes.filler, None))
    except Exception as error:  # as at start: a compile error can be of any type
        logger.exception("Tracing the grid again at %d threads failed", threads)
        detail = f"tracing again at {threads} threads: {eager_fallback.fallback_of(error)}"
        engine.model.fall_back_to_eager(eager_fallback.Fallback("retrace_failed", detail))
        return
    logger.info("Grid traced again at %d threads in %.1fs", threads, time.perf_counter() - began)
