"""The worker: one model served, built once per process and never rebuilt, under any server.

`Worker.build(placement, task_class, metrics)` reads the archive, builds, warms and checks the
engine (handlers/startup/serving.py, handlers/startup/build_steps.py) and says it is ready; after that a loop
(handlers/loops/request_batches.py, handlers/loops/scheduled_requests.py, handlers/loops/decode_loop.py) drives requests
through its three steps, top to bottom:

    reader.accept(incoming) the body read by its route's protocol, checked, tokenized -> Accepted
                            (handlers/worker/reading.py)
    run(accepted requests)  the engine over their texts in one go -> each one's output rows
                            (repeated texts' from handlers/worker/row_cache.py, where it is on)
    respond(accepted, rows) the task's answers in the protocol's body

Nothing here knows a server: what the server says of the worker is a `Placement`, a request is an
`Incoming`, metrics go to a `MetricsSink`. The only state that changes after `build` is the
traffic's statistics, the thread counts traced and the rows cached.
"""

import dataclasses
import importlib.metadata
import logging
import time
from typing import Any

import torch

from ts_compiled_handlers.configuration.config import HandlerConfig, parse
from ts_compiled_handlers.configuration.placement import Placement
from ts_compiled_handlers.engine.engine import Engine
from ts_compiled_handlers.engine.layout import Call
from ts_compiled_handlers.protocols import Protocol, RequestSpec, Served, route_protocol
from ts_compiled_handlers.request.outcome import isolate, refusal
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.request.tokenizing import Accepted, TextTokenizer
from ts_compiled_handlers.runtime import allocator, tracing
from ts_compiled_handlers.runtime.json_text import as_json
from ts_compiled_handlers.runtime.metrics import MetricsSink
from ts_compiled_handlers.runtime.process_settings import ThreadShare
from ts_compiled_handlers.startup import build_steps, start_cost
from ts_compiled_handlers.startup.serving import Serving, Started, read_serving
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.worker import ready_report
from ts_compiled_handlers.worker.messages import USAGE_HEADER, Reply
from ts_compiled_handlers.worker.reading import RequestReader
from ts_compiled_handlers.worker.row_cache import RowCache
from ts_compiled_handlers.worker.traffic_stats import LengthStats

logger = logging.getLogger(__name__)

NULL_SINK = MetricsSink()


def text_tokenizer(task: Task, serving, limit: int) -> TextTokenizer:
    """The request path's tokenizer: the plan's length limit, the overflow policy, the task's
    options, and token ids bounded by the model's embedding table as well as its vocabulary."""
    return TextTokenizer(
        serving.tokenizer,
        limit,
        serving.config.buckets.overflow == "reject",
        offsets=task.OFFSETS,
        embeddings=getattr(serving.model_config.get_text_config(), "vocab_size", None),
        **task.tokenizer_options(),
    )


@dataclasses.dataclass(frozen=True)
class Worker:
    """One model served: what was built for it, and the request path's three steps."""

    placement: Placement
    task: Task
    serving: Serving
    engine: Engine
    started: Started
    threads: ThreadShare
    reader: RequestReader
    lengths: LengthStats
    metrics: MetricsSink
    traced_threads: set[int] = dataclasses.field(default_factory=set)
    cache: RowCache | None = None  # repeated texts' rows (`handler.cache_bytes`; None: off)
    tracer: tracing.Tracer | None = None  # request spans (`handler.tracing`; None: off)

    @classmethod
    def build(
        cls,
        placement: Placement,
        task_class: type[Task],
        metrics: MetricsSink = NULL_SINK,
        progress=None,
        config: HandlerConfig | None = None,
    ):
        """The worker, ready: engine built, warmed over the grid, checked; `progress(done, total)`
        is told of each warmed shape (the build's bar); `config`: the placement's, parsed already."""
        began = time.perf_counter()
        allocator.log_in_use()  # a serving worker's, not a build's or a benchmark's
        task, serving, threads = cls.read(placement, task_class, config)
        planned = start_cost.logged_plan(serving)
        engine, started = build_steps.build_engine(task, serving, progress)
        engine.model.mark_ready()
        config = serving.config
        worker = cls(
            placement,
            task,
            serving,
            engine,
            started,
            threads,
            RequestReader(
                task,
                RequestSpec(
                    task.param_checks(),
                    config.max_inputs,
                    task.adapt_body,
                    task.PAIRS,
                    placement.model_name,
                    serving.tokenizer,
                    tei_info(placement, task, engine, config),
                    task.prompts,
                    task.budget,  # one limit, checked before an answer is made and on its text
                ),
                text_tokenizer(task, serving, engine.plan.max_seq_len),
            ),
            LengthStats(placement.model_name, config.buckets.histogram_every),
            metrics,
            {threads.threads},
            RowCache(config.cache_bytes) if config.cache_bytes else None,
            tracing.tracer_for(config.tracing, placement.model_name, task.NAME),
        )
        ready_report.announce(metrics, engine, started, serving, threads, time.perf_counter() - began)
        if planned is not None and started.cache_source != "aot":  # the plan is a compiling start's
            logger.info("Started in %.0f s, planned %.0f s", time.perf_counter() - began, planned.seconds)
        return worker

    @staticmethod
    def read(
        placement: Placement, task_class: type[Task], config: HandlerConfig | None = None
    ) -> tuple[Task, Serving, ThreadShare]:
        """Everything before the model: the task, configuration, threads, tokenizer, plan (the AOT
        build starts here too)."""
        task = task_class(config or parse(placement.yaml_config), continuous=placement.continuous)
        serving, threads = read_serving(placement, task)
        task.read_settings(serving)
        return task, serving, threads

    @property
    def served(self) -> Served:
        return Served(self.placement.model_name, self.placement.model_version)

    @property
    def model_source(self) -> str:
        """What the worker serves from: `aot package`, `archive cache`, `host cache`, `compiled` or `eager`."""
        return ready_report.model_source(self.engine, self.started)

    # -- the request path ---------------------------------------------------------------------
    def run(self, requests: list[Accepted]) -> list[list[torch.Tensor]]:
        """The engine over the requests' texts in one go: each request's output rows, in order.
        Runs where the model's calls run, so the cores are re-shared (and the grid re-traced) first."""
        self.follow_worker_count()
        began = time.time_ns() if self.tracer is not None else 0
        token_ids, type_ids = [ids for request in requests for ids in request.token_ids], type_ids_of(requests)
        adapters = self.adapters_of(requests) if self.engine.layout.adapters else None
        if self.cache is None:
            kept = self.kept_parts(requests) if self.task.token_values else None  # pooled rows: kept whole
            computed = self.compute(token_ids, type_ids, adapters, kept)
        else:  # cached rows answer later requests whatever they ask: kept whole
            computed, found = self.cache.rows_for(token_ids, type_ids, self.compute, adapters)
            self.record_cache(len(token_ids), found)
        rows, position = [], 0
        for request in requests:
            rows.append(computed[position : position + len(request.token_ids)])
            position += len(request.token_ids)
        if any(request.request.images is not None for request in requests):  # a task that takes images
            rows = self.task.with_images(requests, rows)
        if self.tracer is not None:
            tracing.mark_call(requests, began, time.time_ns())
        return rows

    def compute(
        self, token_ids: list[list[int]], type_ids: list[list[int]] | None, adapters: list[int] | None = None, kept=None
    ) -> list[torch.Tensor]:
        """The engine over the texts, its calls counted as traffic: each text's rows (`kept`: each
        text's KeptPart or None, the part of its row its answer reads)."""
        outputs = self.engine.run(token_ids, type_ids=type_ids, adapters=adapters, kept=kept)
        self.record_traffic(outputs.lengths, outputs.calls)
        return outputs.rows

    def kept_parts(self, requests: list[Accepted]) -> list | None:
        """Each text's KeptPart, its request's (the task's `kept_part`); None where every row is kept whole."""
        parts = [self.task.kept_part(request) for request in requests]
        if all(part is None for part in parts):
            return None
        return [part for request, part in zip(requests, parts, strict=True) for _ in request.token_ids]

    def adapters_of(self, requests: list[Accepted]) -> list[int]:
        """Each text's adapter id: its request's `adapter` (1 for the first the archive names), 0 for none."""
        ids = {name: number for number, name in enumerate(self.serving.config.adapters, start=1)}
        return [ids.get(request.request.params.get("adapter"), 0) for request in requests for _ in request.token_ids]

    def run_each(self, requests: list[Accepted], on_split) -> list:
        """`run` over the requests, a failing call split until only a request that fails alone gets
        its exception (handlers/request/outcome.py): each request's rows, or its exception."""
        return isolate(requests, self.run, on_split)

    def respond(self, accepted: Accepted, rows: list[torch.Tensor]) -> Any:
        """The request's body: the task's answers in its protocol's form."""
        request = accepted.request
        return request.protocol.encode(request, self.task.answer(accepted, rows), self.served, accepted.tokens)

    def reply(self, accepted: Accepted, rows: list[torch.Tensor]) -> "Reply":
        """The request's reply, its body encoded once, its usage in a header."""
        body = self.encoded(self.respond(accepted, rows), accepted.request.protocol)
        return Reply(body, headers={USAGE_HEADER: str(accepted.tokens)})

    def encoded(self, answer: Any, protocol: Protocol) -> str:
        """An answer as JSON text, if it fits the answer budget (else a 413 naming the protocol's
        field of texts): the last guard before TorchServe's `max_response_size` drops the worker."""
        return self.reader.spec.budget.check_text(as_json(answer), protocol.texts_field)

    def protocol_of(self, route: str) -> Protocol:
        """The route's last protocol, whose shape its refusals take (the plain one for an unknown route)."""
        return route_protocol(route, self.task.protocols)

    def error_body(self, route: str, error: RequestError) -> Any:
        """A refusal in the shape of the route's protocols (the plain one for an unknown route)."""
        return self.protocol_of(route).error(error)

    def refused(self, route: str, error: BaseException, stage: str) -> "Reply":
        """The reply to a request that failed in `stage`: a bug is counted and logged, and a 500."""
        if not isinstance(error, RequestError):
            self.metrics.count("RequestFailures", stage, 1)
        refused = refusal(error, stage)
        return Reply(as_json(self.error_body(route, refused)), refused.status)

    # -- what the worker keeps track of -------------------------------------------------------
    def record_traffic(self, lengths: list[int], calls: list[Call]) -> None:
        """Count live traffic's lengths, padding (pack tails included) and texts per shape; export
        them with the recompiles since ready, in one go. Warm-up and re-tracing are not traffic."""
        ready = self.engine.model.ready
        if ready:
            self.lengths.record(lengths, sum(call.group.tokens for call in calls))
        self.report_recompiles()
        if not ready:
            return
        # 3 decimals: the ratio settles after some traffic, and a gauge is a log line only when it changes
        self.metrics.gauge("PaddedTokenRatio", round(self.lengths.padded_ratio, 3), "Ratio")
        prefix = "packed " if self.engine.layout.packed else ""
        for call in calls:
            self.metrics.count(
                "BucketRequests", f"{prefix}{call.group.batch_size}x{call.group.seq_len}", len(call.texts)
            )

    def record_cache(self, texts: int, found: int) -> None:
        """The texts answered from the cache (or repeated within the call) and those computed; its bytes."""
        self.metrics.count("CachedTexts", "hit", found)
        self.metrics.count("CachedTexts", "miss", texts - found)
        self.metrics.gauge("CacheBytes", self.cache.bytes, "Bytes")

    def record_call(self, made) -> None:
        """A scheduled call's histograms (`made`: its tokens, and how long each of its requests
        waited in the queue), written after the call's traffic, in units that fit Prometheus'
        default buckets (0.005 to 10)."""
        self.metrics.observe("CallKilotokens", made.tokens / 1000, "Kilotokens")
        for seconds in made.waited:
            self.metrics.observe("SchedulerQueueTime", round(seconds, 6), "Seconds")

    def report_recompiles(self) -> None:
        self.metrics.gauge("RecompilesAfterReady", self.engine.model.recompiles_after_ready, "Count")

    def follow_worker_count(self) -> None:
        """Re-share the cores if workers came or went (and trace the grid at the new thread count)."""
        try:
            changed = self.threads.refresh()
        except OSError as error:  # the count is an optimization: never a reason to fail a batch
            logger.warning("Could not recount the live workers: %s", error)
            return
        model, threads = self.engine.model, self.threads.threads
        if changed and model.is_compiled and model.guards_thread_count and threads not in self.traced_threads:
            self.traced_threads.add(threads)
            build_steps.trace_again(self.engine, self.serving, threads)


def tei_info(placement: Placement, task: Task, engine: Engine, config) -> dict:
    """What TEI's `GET info` answers (handlers/protocols/tei.py): the model, its limits, this release."""
    try:
        version = importlib.metadata.version("ts-compiled-handlers")
    except importlib.metadata.PackageNotFoundError:  # served from an archive's copy alone
        version = None
    return {
        "model_id": placement.model_name,
        "model_dtype": str(engine.dtype).removeprefix("torch."),
        "model_type": task.tei_model_type(),
        "max_input_length": engine.plan.max_seq_len,
        "max_batch_tokens": max(engine.plan.batch_sizes) * engine.plan.max_seq_len,
        "max_client_batch_size": config.max_inputs,
        "auto_truncate": config.buckets.overflow != "reject",
        "version": version,
    }


def type_ids_of(requests: list[Accepted]) -> list[list[int]] | None:
    """The token types of the requests' texts, where any of them is a text pair (else None: all 0)."""
    if all(request.tokenized.type_ids is None for request in requests):
        return None
    return [
        types
        for request in requests
        for types in request.tokenized.type_ids or [[0] * len(ids) for ids in request.token_ids]
    ]
