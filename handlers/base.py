"""The TorchServe lifecycle shared by every task: initialize, handle, and nothing task-specific.

A task handler subclasses `CompiledHandler` and supplies the module to compile (`build_model`),
its request parameters (`PARAMS`), and how one output row becomes an answer (`encode`). Tasks
that do not answer with one forward pass per text (generation) replace `checked_outputs`,
`inference` and `answer`. `handle` has TorchServe's shape: it drives `preprocess` (decode, check,
tokenize, pad to buckets), `inference` and `postprocess`, each overridable the way TorchServe's
docs teach, and each request runs inside its own failure boundary (handlers/batch.py).
"""

import contextlib
import copy
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Encoding
from transformers import AutoConfig, AutoTokenizer
from ts.torch_handler.base_handler import BaseHandler

from handlers import (
    aot_package,
    buckets,
    compile_cache,
    hardware,
    kserve_v2,
    packing,
    payload,
    process_settings,
    warmup,
)
from handlers.batch import Accepted, Batch, split_until_isolated
from handlers.compiling import CompiledModel
from handlers.config import CompileConfig, HandlerConfig, parse
from handlers.length_stats import LengthStats
from handlers.metrics import count, emit

logger = logging.getLogger(__name__)

HARDWARE = hardware.detect()
CACHE_SOURCES = {
    "archive": "hit, unpacked from the archive",
    "host": "hit, this host's cache from an earlier worker",
    "compiled": "miss, compiled here",
    "off": "off",
    "aot": "not needed, the archive's AOT package serves",
}
# A configured dtype name (handlers/config.py DTYPE_NAMES, less `auto`) -> its torch dtype.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def run_eager(module: torch.nn.Module) -> CompiledModel:
    """`module` run eagerly behind the same interface as the compiled model."""
    return CompiledModel(module, CompileConfig(enable=False), graphs_needed=0)


class CompiledHandler(BaseHandler):
    """Loads, compiles and warms a model over its bucket grid, then serves batches of requests."""

    PARAMS: dict[str, payload.ParamCheck] = {}
    # Called as warmup_progress(done, total) after each shape of the warm-up grid (the build's bar).
    warmup_progress = None

    # -- task hooks -------------------------------------------------------------------------
    def build_model(self, model_dir: Path) -> torch.nn.Module:
        """The float32 module to compile: forward(input_ids, attention_mask) -> (batch, ...)."""
        raise NotImplementedError

    def max_seq_len(self, model_dir: Path) -> int | None:
        """The model's own length limit, if it has one; it caps the largest bucket."""
        return None

    def encode(self, rows: list[torch.Tensor], body: payload.Payload, encodings: list[Encoding]) -> Any:
        """The JSON answer for one request from its output rows and tokenizations (one per text)."""
        raise NotImplementedError

    def from_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """One text's output row from its per-token outputs in a packed row (tasks that pack).

        A task packs if the module of `build_model` also has `tokens(input_ids, attention_mask,
        position_ids)`: per-token outputs under a 4-D additive mask (handlers/packing.py)."""
        raise NotImplementedError

    def param_checks(self) -> dict[str, payload.ParamCheck]:
        """The request parameters this task accepts, each with its check."""
        return self.PARAMS

    def graphs_needed(self) -> int:
        """Graphs the warm-up grid must compile (more means graph breaks or lost guards)."""
        return buckets.expected_graphs(self.plan)

    def configure_tokenizer(self, tokenizer) -> None:
        """Task-specific tokenizer settings (e.g. which side truncation cuts)."""

    def adapt_body(self, value: Any) -> Any:
        """A task's own request form rewritten to the common one (chat messages to a prompt)."""
        return value

    def read_task_settings(self, model_dir: Path, model_config) -> None:
        """What the task reads from the model's files besides the module (labels, pooling): a
        worker serving an AOT package never builds the module."""

    # -- lifecycle ---------------------------------------------------------------------------
    def initialize(self, context):
        self.started = time.perf_counter()
        self.load_settings(context)
        if not self._serve_from_package():
            module = self.load_module()
            self.load_seconds = time.perf_counter() - self.started
            self._compile_and_warm_up(module)
        self.model.mark_ready()
        self.traced_threads = {self.worker.threads}
        self.lengths = LengthStats(context.model_name, self.config.buckets.histogram_every)
        self.initialized = True
        self._log_ready(self.warmup_report, time.perf_counter() - self.started)

    def load_model(self, context) -> torch.nn.Module:
        """Everything before compiling, and the eager model at its dtype (the build starts here)."""
        self.load_settings(context)
        return self.load_module()

    def load_settings(self, context) -> None:
        """Configuration, threads, tokenizer, bucket plan and the task's settings: all but the module."""
        self.context = context
        self.config: HandlerConfig = parse(context.model_yaml_config)
        self.model_dir = Path(context.system_properties["model_dir"])
        self.worker = process_settings.share_cores(self.config.threads, self.config.workers, self.model_dir)
        self.device = self._device(context.system_properties.get("gpu_id"))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir, trust_remote_code=False)
        if not self.tokenizer.is_fast:
            raise ValueError(f"{self.model_dir} has no fast tokenizer (tokenizer.json); offsets and speed need one")
        self.configure_tokenizer(self.tokenizer)
        model_config = AutoConfig.from_pretrained(self.model_dir, trust_remote_code=False)
        self._check_vocabulary(model_config)
        self.read_task_settings(self.model_dir, model_config)
        self.plan = self._plan(self.model_dir)
        self.pack_budget: int | None = None  # set once packing passes its check (or the package packs)
        self.first_position = 0
        self.compile_options = dataclasses.replace(self.config.compile, dynamic=self.plan.dynamic)  # a task may fix it

    def load_module(self) -> torch.nn.Module:
        """The eager model on the device at the chosen dtype (`dtype: auto` is checked on it)."""
        module = self.build_model(self.model_dir).eval().to(self.device)
        self.dtype = self._choose_dtype(module)
        return self._choose_layout(module.to(self.dtype))

    def package_manifest(self) -> dict:
        """What an AOT package must have been built for to serve this worker."""
        return aot_package.manifest(HARDWARE, self.dtype, self.plan, self.compile_options, self.model_dir)

    def build_package(self, module: torch.nn.Module) -> dict:
        """Export `module` into the archive's AOT package, with eager's answers on the probe rows
        that a worker checks the package against (returns the build's timings)."""
        probe = self._package_probe()
        reference = aot_package.Reference(probe, self.infer(probe, run_eager(module)))
        valid_for = self.package_manifest()
        layout = aot_package.Layout(self.pack_budget, self.first_position)
        return aot_package.build(module, self.plan, self.compile_options, valid_for, self.model_dir, reference, layout)

    def _serve_from_package(self) -> bool:
        """Serve the archive's AOT package if it matches this worker and passes warm-up and the
        check; otherwise say why, loudly, and let the worker compile."""
        packed = self.model_dir / aot_package.PACKAGE_DIR
        if not (packed.is_dir() and self.config.compile.enable and self.config.task in aot_package.TASKS):
            return False
        # `dtype: auto` is not checked against float32 again: the build did, on this model and on
        # hardware with the CPU flags or CUDA capability the manifest makes this worker match.
        self.dtype = DTYPES.get(self.config.dtype, HARDWARE.auto_dtype)
        try:
            package = aot_package.load(packed, self.package_manifest(), self.model_dir, self.device)
            self.pack_budget, self.first_position = package.layout.pack_budget, package.layout.first_position
            self.model = aot_package.AotModel(package, self._load_eager_later, self.plan)
            self.load_seconds = time.perf_counter() - self.started
            self.warmup_report = self._warm_up_package(package.reference)
        except Exception as error:  # a package of any defect is a reason to compile, never to fail
            self.pack_budget, self.first_position = None, 0  # the compiled model decides its own layout
            logger.warning("AOT package IGNORED, compiling instead: %s: %s", type(error).__name__, error)
            return False
        self.cache_source = "aot"
        return True

    def _load_eager_later(self) -> torch.nn.Module:
        """The eager model for an AOT worker that needs it after all (a shape outside the package)."""
        began = time.perf_counter()
        module = self.build_model(self.model_dir).eval().to(self.device, self.dtype)
        logger.info("Eager model loaded in %.1fs", time.perf_counter() - began)
        return module if self.pack_budget is None else packing.PackedModel(module)

    def _compile_and_warm_up(self, module: torch.nn.Module) -> None:
        self.model = CompiledModel(module, self.compile_options, self.graphs_needed())
        with self._compile_cache(self.model_dir) as lease:
            self.warmup_report = self._warm_up()
            if lease is not None and self.model.is_compiled:
                self.host_cache.publish(lease)
        self.cache_source = lease.source if lease is not None and self.model.is_compiled else "off"
        if self.model.is_compiled:
            process_settings.stop_compile_workers()

    # -- requests: TorchServe's handle -> preprocess -> inference -> postprocess ----------------
    def handle(self, data, context):
        """Answers for a batch, one per request in order; a request's failure is its own answer."""
        self.context = context
        self.follow_worker_count()
        try:
            answers = self.postprocess(self.inference(self.preprocess(data)))
        except Exception as error:  # a defect past every per-request boundary: still answer everyone
            batch = Batch.of(len(data), context)
            for index in range(len(data)):
                batch.fail(index, "handle", error)
            answers = batch.answers
        emit(context, "RecompilesAfterReady", self.model.recompiles_after_ready, "Count")
        return answers

    def follow_worker_count(self) -> None:
        """Re-share the cores if workers came or went (and trace the grid at the new thread count)."""
        try:
            if self.worker.refresh():
                self._trace_at_new_thread_count()
        except OSError as error:  # the count is an optimization: never a reason to fail a batch
            logger.warning("Could not recount the live workers: %s", error)

    def preprocess(self, data) -> Batch:
        """Decode, check and tokenize each request in its own boundary, then pad the texts to buckets."""
        batch = Batch.of(len(data), self.context)
        for index, request in enumerate(data):
            with batch.guard(index, "preprocess"):
                body = self.parse_request(request, index)
                batch.accepted.append(Accepted(index, body, self.tokenize(body.texts)))
        batch.prepared = self.prepare(self._token_ids(batch.accepted))
        return batch

    def inference(self, data: Batch, *args, **kwargs) -> Batch:
        """The model over the accepted requests' texts; a failing call is split until it is isolated."""

        def run(requests: list[Accepted]) -> None:
            token_ids = self._token_ids(requests)
            prepared = data.take_prepared() or self.prepare(token_ids)
            rows = self.run_prepared(token_ids, prepared)
            position = 0
            for request in requests:
                data.outputs[request.index] = rows[position : position + len(request.encodings)]
                position += len(request.encodings)

        split_until_isolated(data, data.accepted, run)
        return data

    def postprocess(self, data: Batch) -> list[Any]:
        """Each served request's answer (in KServe v2 form if it came so), checked to be sendable."""
        version = self._model_version(self.context)
        for request in data.live(data.accepted):
            with data.guard(request.index, "postprocess"):
                answer = self.answer(request, data.outputs[request.index])
                if request.body.v2_id is not None:
                    answer = kserve_v2.response(answer, self.context.model_name, version, request.body.v2_id)
                payload.check_sendable(answer)
                data.answers[request.index] = answer
        return data.answers

    def answer(self, request: Accepted, outputs: Any) -> Any:
        """The JSON answer of one request from what inference made for it (its output rows)."""
        return self.encode(outputs, request.body, request.encodings)

    @staticmethod
    def _token_ids(requests: list[Accepted]) -> list[list[int]]:
        return [encoding.ids for request in requests for encoding in request.encodings]

    # -- the request path after tokenization (warm-up takes it too) -------------------------
    def infer(self, token_ids: list[list[int]], model=None) -> list[torch.Tensor]:
        """Output rows, in order, for tokenized texts: packed or grouped by bucket, padded, run."""
        return self.run_prepared(token_ids, self.prepare(token_ids), model)

    def checked_outputs(self, token_ids: list[list[int]], model=None) -> list[torch.Tensor]:
        """What warm-up runs and the compiled-vs-eager and `dtype: auto` checks compare, per text:
        the rows of `infer`. A task whose requests are not one forward pass (generation) gives its own."""
        return self.infer(token_ids, model)

    def infer_rows(self, token_ids: list[list[int]], model=None) -> list[torch.Tensor]:
        """`checked_outputs` with each text in a row of its own even where texts would be packed:
        warm-up and benchmarks reach every (rows, seq_len) shape of the grid this way."""
        if self.pack_budget is None:
            return self.checked_outputs(token_ids, model)
        return self.run_prepared(token_ids, self.prepare(token_ids, one_per_row=True), model)

    def prepare(self, token_ids: list[list[int]], one_per_row: bool = False) -> list[buckets.Prepared]:
        """The texts packed into rows (or grouped by bucket), the rows grouped by bucket, each group
        padded to its bucket's shape."""
        lengths = [len(ids) for ids in token_ids]
        if self.pack_budget is None:
            groups = buckets.group_requests(lengths, self.plan)
            return [
                buckets.Prepared(group, buckets.pad_group([token_ids[i] for i in group.indices], group, self.pad_id))
                for group in groups
            ]
        rows = [[text] for text in range(len(lengths))] if one_per_row else packing.pack_rows(lengths, self.pack_budget)
        groups = buckets.group_requests([sum(lengths[text] for text in row) for row in rows], self.plan)
        return [
            buckets.Prepared(group, *packing.pad_packs(token_ids, rows, group, self.pad_id, self.first_position))
            for group in groups
        ]

    def run_prepared(self, token_ids: list[list[int]], prepared: list[buckets.Prepared], model=None) -> list:
        """One model call per padded group; output rows back in the texts' order."""
        model = model or self.model
        rows: list[torch.Tensor | None] = [None] * len(token_ids)
        with torch.inference_mode():
            for group, padded, spans in prepared:
                inputs = {name: tensor.to(self.device) for name, tensor in padded.items()}
                output = model(inputs).float().cpu()
                if spans is None:
                    for row, index in enumerate(group.indices):
                        rows[index] = output[row]
                else:
                    for span in spans:
                        rows[span.text] = self.from_tokens(output[span.row, span.start : span.start + span.length])
        if self.initialized:
            packed = None if self.pack_budget is None else [len(item.spans) for item in prepared]
            self.record_padding([len(ids) for ids in token_ids], [item.group for item in prepared], packed)
        return rows

    def record_padding(self, lengths: list[int], groups: list[buckets.Group], packed: list[int] | None = None) -> None:
        """Count live traffic's lengths, padding (pack tails included) and texts per shape; export
        the padded-token ratio since ready. `packed`: texts per group where groups hold packed rows."""
        if not self.model.ready:  # a grid traced again after a re-share is not traffic
            return
        self.lengths.record(lengths, buckets.padded_tokens(groups))
        emit(self.context, "PaddedTokenRatio", round(self.lengths.padded_ratio, 4), "Ratio")
        for position, group in enumerate(groups):
            shape = f"{group.batch_size}x{group.seq_len}"
            texts = len(group.indices) if packed is None else packed[position]
            count(self.context, "BucketRequests", shape if packed is None else "packed " + shape, texts)

    # -- initialize steps --------------------------------------------------------------------
    @staticmethod
    def _device(gpu_id) -> torch.device:
        if HARDWARE.device == "cuda" and gpu_id is not None:
            return torch.device(f"cuda:{gpu_id}")
        return torch.device("cpu")

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def _check_vocabulary(self, model_config) -> None:
        """A token id past the embedding table aborts the whole worker inside a compiled kernel."""
        rows = model_config.get_text_config().vocab_size
        largest = max(self.tokenizer.get_vocab().values())
        if rows is not None and largest >= rows:
            raise ValueError(f"the tokenizer makes token id {largest} but the model embeds only {rows} tokens")

    def _plan(self, model_dir: Path) -> buckets.BucketPlan:
        seq_lens = self.config.buckets.seq_lens
        limit = min(filter(None, (self.max_seq_len(model_dir), self.tokenizer.model_max_length)))
        if seq_lens[-1] > limit:
            seq_lens = tuple(length for length in seq_lens if length < limit) + (limit,)
            logger.info("Length buckets capped at the model's limit of %d tokens: %s", limit, seq_lens)
        pack = self.config.buckets.pack_tokens
        budget = None if pack == "off" else min(seq_lens[-1], packing.AUTO_BUDGET if pack == "auto" else pack)
        return buckets.BucketPlan(seq_lens, self.config.buckets.batch_sizes, self.config.compile.dynamic, budget)

    def _choose_dtype(self, module: torch.nn.Module) -> torch.dtype:
        """The configured dtype; for `auto`, the hardware's pick if it stays close to float32."""
        if self.config.dtype != "auto":
            return DTYPES[self.config.dtype]
        chosen = HARDWARE.auto_dtype
        if chosen == torch.float32 or not self.config.warmup.verify:
            return chosen
        probe = self._probe_ids()
        reference = self.checked_outputs(probe, run_eager(module))
        candidate = copy.deepcopy(module).to(chosen)  # casting back to float32 would lose bits
        try:
            outputs = self.checked_outputs(probe, run_eager(candidate))
            warmup.check_drift(f"dtype auto -> {chosen}", outputs, reference, self._tolerance(chosen))
        except warmup.WarmupError as error:
            self._on_failure(error)
            chosen = torch.float32
        return chosen

    def _choose_layout(self, module: torch.nn.Module) -> torch.nn.Module:
        """The module over packed rows if the plan packs and, on the probe, each text packed with
        others gets the answer it gets alone; otherwise the module itself (length groups)."""
        if self.plan.pack_tokens is None or not hasattr(module, "tokens"):
            return module
        probe = self._probe_ids()
        alone = self.infer(probe, run_eager(module))
        packed = packing.PackedModel(module)
        self.pack_budget, self.first_position = self.plan.pack_tokens, packing.first_position(module)
        try:
            together = self.infer(probe, run_eager(packed))
            trimmed = [row[: len(ids)] if row.dim() > 1 else row for row, ids in zip(alone, probe, strict=True)]
            warmup.check_drift("packed vs alone", together, trimmed, self._tolerance(self.dtype))
            warmup.check_error("packed vs alone", together, trimmed, self._tolerance(self.dtype) ** 0.5)
        except Exception as error:  # any failure (a model without position_ids, a head it cannot reach) means groups
            self.pack_budget = None
            logger.warning("Packing OFF, texts run in length groups: %s: %s", type(error).__name__, error)
            return module
        logger.info("Packing on: rows of up to %d tokens, positions from %d", self.pack_budget, self.first_position)
        return packed

    def _compile_cache(self, model_dir: Path):
        """The lease on this host's compile cache (None where compilation or the cache is off)."""
        option = self.config.compile.cache_dir
        root = compile_cache.default_root() if option == "auto" else None if option == "off" else Path(option)
        if not self.config.compile.enable or root is None:
            return contextlib.nullcontext(None)
        valid_for = compile_cache.manifest(HARDWARE, self.dtype, self.plan, self.model.options, model_dir)
        self.host_cache = compile_cache.HostCache(root, valid_for)
        return self.host_cache.lease(model_dir / compile_cache.PACKED_DIR)

    def _warm_up(self) -> warmup.WarmupReport:
        iterations = self.config.warmup.iterations
        try:
            self.model.compile()
            check = self.graphs_needed() if self.model.is_compiled else None
            report = warmup.run_grid(self.infer_rows, self.plan, iterations, self._filler, check, self.warmup_progress)
            if self.model.is_compiled and self.config.warmup.verify:
                probe = self._probe_ids()
                eager = self.checked_outputs(probe, run_eager(self.model.eager))
                compiled = self.checked_outputs(probe)
                warmup.check_drift("compiled vs eager", compiled, eager, self._tolerance(self.dtype))
            return report
        except Exception as error:  # a compile error can be of any type; all follow on_failure
            if not self.config.compile.enable:
                raise
            self._on_failure(error)
            self.model.fall_back_to_eager(f"{type(error).__name__}: {error}")
            return dataclasses.replace(warmup.run_grid(self.infer_rows, self.plan, 1, self._filler, None), graphs=0)

    def _warm_up_package(self, reference: aot_package.Reference) -> warmup.WarmupReport:
        """Each length bucket once at batch 1 and the largest batch once, then the package against
        the build's eager answers. A package's first call at a new shape costs what later calls do
        (only the first calls of all set up the runtime; docs/design.md, "Cold start and AOT
        packages"), so the whole grid bought nothing; the build ran it, and the full check, on its
        own host."""
        began = time.perf_counter()
        shapes = [(1, seq_len) for seq_len in self.plan.seq_lens] + [(self.plan.max_batch, self.plan.seq_lens[0])]
        for done, (batch, seq_len) in enumerate(shapes, start=1):
            self.infer_rows(self._filler(seq_len, batch))
            if self.warmup_progress is not None:
                self.warmup_progress(done, len(shapes))
        seconds = time.perf_counter() - began
        if self.config.warmup.verify:
            outputs = self.infer(reference.token_ids)
            warmup.check_drift("AOT package vs the build's eager", outputs, reference.rows, self._tolerance(self.dtype))
        return warmup.WarmupReport(len(shapes), 0, seconds, seconds)

    def _trace_at_new_thread_count(self) -> None:
        """Dynamo guards on the thread count, so without this every call after a re-share would
        count as a recompile and run eagerly. The kernels come from inductor's cache (built with
        dynamic threads, they do not change); dynamo keeps the graphs of every count it has seen."""
        threads = self.worker.threads
        if not (self.model.is_compiled and self.model.guards_thread_count) or threads in self.traced_threads:
            return
        began = time.perf_counter()
        self.traced_threads.add(threads)
        try:
            self.model.retrace(lambda: warmup.run_grid(self.infer_rows, self.plan, 1, self._filler, None))
        except Exception as error:  # as at start: a compile error can be of any type
            self.model.fall_back_to_eager(f"tracing again at {threads} threads: {type(error).__name__}: {error}")
            return
        logger.info("Grid traced again at %d threads in %.1fs", threads, time.perf_counter() - began)

    def _on_failure(self, error: Exception) -> None:
        logger.error("Compile or warm-up check failed (on_failure=%s): %s", self.config.compile.on_failure, error)
        if self.config.compile.on_failure == "fail":
            raise error

    def _tolerance(self, dtype: torch.dtype) -> float:
        return self.config.warmup.tolerance or warmup.AUTO_TOLERANCE[dtype]

    def _special_ids(self) -> tuple[int, int]:
        ids = self.tokenizer("x")["input_ids"]
        return ids[0], ids[-1]

    def _filler(self, seq_len: int, rows: int) -> list[list[int]]:
        return warmup.filler_ids(seq_len, rows, len(self.tokenizer), self._special_ids())

    def _package_probe(self) -> list[list[int]]:
        """The probe rows of the smallest and the largest length bucket."""
        probe = self._probe_ids()
        rows = len(probe) // len(self.plan.seq_lens)
        return probe[:rows] + probe[-rows:]

    def _probe_ids(self) -> list[list[int]]:
        """Two rows per length bucket, one full and one shorter, for compiled-vs-eager checks."""
        rows = self.plan.batch_sizes[min(1, len(self.plan.batch_sizes) - 1)]
        probe = []
        for previous, seq_len in zip((1,) + self.plan.seq_lens, self.plan.seq_lens, strict=False):
            lengths = [seq_len] + [max(previous + 1, 2)] * (rows - 1)
            probe += [self._filler(length, 1)[0] for length in lengths]
        return probe

    @property
    def model_source(self) -> str:
        """What the worker serves from: `aot package`, `archive cache`, `host cache`, `compiled` or `eager`."""
        if not self.model.is_compiled:
            return "eager"
        return {"aot": "aot package", "archive": "archive cache", "host": "host cache"}.get(
            self.cache_source, "compiled"
        )

    def _log_ready(self, report: warmup.WarmupReport, seconds: float) -> None:
        emit(self.context, "CompileSeconds", round(report.compile_seconds, 3), "Seconds")
        emit(self.context, "WarmupSeconds", round(report.warmup_seconds, 3), "Seconds")
        emit(self.context, "RecompilesAfterReady", 0, "Count")
        cache_hit = self.cache_source in ("archive", "host")
        emit(self.context, "CompileCacheHit", int(cache_hit), "Count")
        emit(self.context, "CompileFallback", int(self.config.compile.enable and not self.model.is_compiled), "Count")
        emit(self.context, "AotPackage", int(self.model_source == "aot package"), "Count")
        logger.info(
            "Ready in %.1fs from %s: %s, %s, dtype %s, compiled=%s mode=%s dynamic=%s regional=%s, "
            "lengths %s x batches %s, %d graphs, model load %.1fs, first pass over the grid %.1fs, warm-up %.1fs, "
            "%d threads (live workers: %d), compile cache: %s",
            seconds,
            self.model_source,
            HARDWARE.device_name,
            sorted(HARDWARE.cpu_flags),
            str(self.dtype).removeprefix("torch."),
            self.model.is_compiled,
            self.config.compile.mode,
            self.plan.dynamic,
            self.config.compile.regional,
            list(self.plan.seq_lens),
            list(self.plan.batch_sizes),
            report.graphs,
            self.load_seconds,
            report.compile_seconds,
            report.warmup_seconds,
            self.worker.threads,
            self.worker.workers,
            CACHE_SOURCES[self.cache_source],
        )

    # -- request steps -----------------------------------------------------------------------
    def parse_request(self, request: dict, index: int) -> payload.Payload:
        """One request's body, decoded and checked: its texts and task parameters."""
        part = "data" if request.get("data") is not None else "body"
        context = self.context
        header = context.get_request_header(index, part) if context.request_processor else None
        content_type = header.get("content-type") if isinstance(header, dict) else None
        value = self.adapt_body(payload.decode(request, content_type))
        read = kserve_v2.parse if kserve_v2.is_v2(value) else payload.parse
        return read(value, self.param_checks(), self.config.max_inputs)

    @staticmethod
    def _model_version(context) -> str | None:
        manifest = getattr(context, "manifest", None) or {}
        return manifest.get("model", {}).get("modelVersion")

    def tokenize(self, texts: list[str]) -> list[Encoding]:
        """Fast-tokenizer encodings per text; over-long texts are truncated or rejected (413) per config."""
        limit = self.plan.max_seq_len
        reject = self.config.buckets.overflow == "reject"
        # One token over the limit is enough to tell an over-long text apart.
        encoded = self.tokenizer(texts, truncation=True, max_length=limit + 1 if reject else limit).encodings
        for position, encoding in enumerate(encoded):
            if not encoding.ids:
                raise payload.RequestError(400, f"text {position} makes no tokens")
            if len(encoding.ids) > limit:
                raise payload.RequestError(
                    413, f"text {position} is longer than {limit} tokens; shorten it or set overflow: truncate"
                )
        return encoded
