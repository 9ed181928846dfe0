"""The TorchServe adapter every task shares: `initialize`, then `handle` -> preprocess / inference / postprocess.

`initialize` builds the engine (handlers/serving.py, handlers/building.py); `handle` has
TorchServe's shape, each step overridable the way TorchServe's docs teach:
- preprocess: per request, its protocol decodes the body (handlers/protocols/) and the texts are
  tokenized (handlers/tokenizing.py);
- inference: the engine runs the accepted requests' texts (handlers/engine.py);
- postprocess: per request, the task makes one answer per text (`answer`) and the protocol the body.
Every request runs inside its own failure boundary (handlers/batch.py), and each answer is encoded
as JSON once, at the end. Under `asyncCommunication: true` the same steps run per request as it
arrives, the model calls scheduled by tokens (handlers/async_handle.py, handlers/scheduler.py).
A task handler subclasses `CompiledHandler` with the module to compile (`build_model`), its
request parameters (`PARAMS`) and its answers (`answer`).
"""

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from ts.torch_handler.base_handler import BaseHandler

from ts_compiled_handlers import async_handle, buckets, building, ready
from ts_compiled_handlers.batch import Accepted, Batch, split_until_isolated
from ts_compiled_handlers.config import HandlerConfig, parse
from ts_compiled_handlers.engine import Engine
from ts_compiled_handlers.layout import Call, Layout
from ts_compiled_handlers.length_stats import LengthStats
from ts_compiled_handlers.metrics import count, emit, observe
from ts_compiled_handlers.model_runner import ModelRunner
from ts_compiled_handlers.model_thread import ModelThread
from ts_compiled_handlers.payload import ParamCheck, boolean_param, choice_param, decode
from ts_compiled_handlers.protocols import Answered, Protocol, Request, RequestSpec, Served, for_route, unknown_route
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.scheduler import CallReport, TokenScheduler
from ts_compiled_handlers.serving import HARDWARE, Serving, read_serving  # noqa: F401 (HARDWARE: detected at import)
from ts_compiled_handlers.tokenizing import SIDES, TextTokenizer, Tokenized

logger = logging.getLogger(__name__)

# Every answer's token count (the request's texts after truncation, special tokens included), as
# TEI reports it; bodies keep their shape (the OpenAI and rerank bodies carry it as `usage` too).
USAGE_HEADER = "x-prompt-tokens"
# Per request: `truncate: false` refuses a text over the limit (413) whatever `buckets.overflow`
# says, `true` cuts it; `truncation_direction` says which end is cut (TEI's and vLLM's names).
TRUNCATION_PARAMS = {"truncate": boolean_param, "truncation_direction": choice_param(*SIDES)}


class CompiledHandler(BaseHandler):
    """Serves a model compiled and warmed over its bucket grid; batches of requests in, answers out."""

    PARAMS: dict[str, ParamCheck] = {}
    PER_TOKEN = False  # the model's outputs are per token (token classification), not per text
    PAIRS = False  # the task takes text pairs (a cross-encoder)
    # Tried in order for a request's route; a protocol is one module (handlers/protocols/).
    protocols = (KServeV2Protocol(), PlainProtocol())
    # Called as warmup_progress(done, total) after each shape of the warm-up grid (the build's bar).
    warmup_progress = None
    scheduler: TokenScheduler | None = None  # and its model_thread: set at initialize under asyncCommunication

    # -- task hooks (handlers/serving.py's Task contract, and the answers) ---------------------
    def build_model(self, model_dir: Path) -> torch.nn.Module:
        """The float32 module to compile: forward(input_ids, attention_mask) -> (batch, ...)."""
        raise NotImplementedError

    def max_seq_len(self, model_dir: Path, config: HandlerConfig) -> int | None:
        """The model's own length limit, if it has one; it caps the largest bucket."""
        return None

    def configure_tokenizer(self, tokenizer) -> None:
        """Task-specific tokenizer settings (e.g. which side truncation cuts)."""

    def read_task_settings(self, model_dir: Path, model_config) -> None:
        """What the task reads from the model's files besides the module (labels, pooling): a
        worker serving an AOT package never builds the module."""

    def adapt_plan(self, plan: buckets.BucketPlan, config: HandlerConfig) -> buckets.BucketPlan:
        return plan

    def graphs_needed(self, plan: buckets.BucketPlan) -> int:
        """Graphs the warm-up grid must compile (more means graph breaks or lost guards)."""
        return buckets.expected_graphs(plan)

    def engine(self, model: ModelRunner, serving: Serving, dtype: torch.dtype, layout: Layout) -> Engine:
        return Engine(model, layout, serving.plan, dtype, serving.device, serving.pad_id, self.PER_TOKEN)

    def param_checks(self) -> dict[str, ParamCheck]:
        """The request parameters this task accepts, each with its check: its own and how to truncate."""
        return {**TRUNCATION_PARAMS, **self.PARAMS}

    def adapt_body(self, value: Any) -> Any:
        """A task's own request form rewritten to the common one (chat messages to a prompt)."""
        return value

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        """One answer per text of the request, from its output rows (one per text, in order)."""
        raise NotImplementedError

    def respond(self, accepted: Accepted, outputs: Any, served: Served) -> Any:
        """The request's body: its answers in its protocol's form."""
        request = accepted.request
        return request.protocol.encode(request, self.answer(accepted, outputs), served, accepted.tokens)

    # -- lifecycle ---------------------------------------------------------------------------
    def initialize(self, context):
        """The engine built, warmed, checked; under asyncCommunication in its own thread, then a scheduler."""
        if not parse(context.model_yaml_config).asynchronous:
            return self.build(context)
        self.model_thread = ModelThread.start(self.build, context)
        self.scheduler = self.token_scheduler(context)

    def build(self, context) -> None:
        began = time.perf_counter()
        self.load_serving(context)
        self.engine, self.started = building.build_engine(self, self.serving, self.warmup_progress)
        self.engine.model.mark_ready()
        self.traced_threads = {self.threads.threads}
        config = self.serving.config
        self.tokenize = TextTokenizer(self.tokenizer, self.engine.plan.max_seq_len, config.buckets.overflow == "reject")
        self.spec = RequestSpec(self.param_checks(), config.max_inputs, self.adapt_body, self.PAIRS, context.model_name)
        self.lengths = LengthStats(context.model_name, config.buckets.histogram_every)
        self.initialized = True
        ready.announce(context, self.engine, self.started, self.serving, self.threads, time.perf_counter() - began)

    def load_serving(self, context) -> Serving:
        """Everything before the model: configuration, threads, tokenizer, plan, the task's settings
        (the AOT build starts here too)."""
        self.context = context
        self.serving, self.threads = read_serving(context, self)
        self.read_task_settings(self.serving.model_dir, self.serving.model_config)
        return self.serving

    @property
    def tokenizer(self):
        return self.serving.tokenizer

    @property
    def model_source(self) -> str:
        """What the worker serves from: `aot package`, `archive cache`, `host cache`, `compiled` or `eager`."""
        return ready.model_source(self.engine, self.started)

    @property
    def config(self):
        return self.serving.config

    def token_scheduler(self, context) -> TokenScheduler:
        """The scheduler of `asyncCommunication: true`: calls of what waits, in a thread of their own."""
        settings = self.config.scheduler

        def call(requests: list[Accepted]) -> list[list[torch.Tensor]]:
            self.follow_worker_count()  # in the model's thread: a re-trace never overlaps a call
            rows = self.run_requests(requests, context)
            emit(context, "RecompilesAfterReady", self.engine.model.recompiles_after_ready, "Count")
            return rows

        def report(made: CallReport) -> None:  # units that fit Prometheus' default buckets, 0.005 to 10
            observe(context, "CallKilotokens", made.tokens / 1000, "Kilotokens")
            for seconds in made.waited:
                observe(context, "SchedulerQueueTime", round(seconds, 6), "Seconds")

        def split(error: BaseException) -> None:
            count(context, "BatchSplits", type(error).__name__, 1)

        budget = self.engine.plan.full_call_tokens if settings.call_tokens == "auto" else settings.call_tokens
        return TokenScheduler(call, budget, settings.max_queue, report, split, self.model_thread.executor)

    def handle(self, data, context):
        """Answers for a batch, one per request in order; a request's failure is its own answer.
        Under `asyncCommunication: true`, a coroutine TorchServe awaits (handlers/async_handle.py)."""
        if self.scheduler is not None:
            return async_handle.handle(self, data, context)
        self.context = context
        self.follow_worker_count()
        try:
            batch = self.inference(self.preprocess(data))
            answers = self.postprocess(batch)
        except Exception as error:  # a defect past every per-request boundary: still answer everyone
            batch = Batch.of(len(data), context)
            for index in range(len(data)):
                batch.fail(index, "handle", error)
            answers = batch.answers
        emit(context, "RecompilesAfterReady", self.engine.model.recompiles_after_ready, "Count")
        return batch.as_json(answers)

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
            building.trace_again(self.engine, self.serving, threads)

    def preprocess(self, data) -> Batch:
        """Decode, check and tokenize each request in its own boundary."""
        batch = Batch.of(len(data), self.context)
        for index, request in enumerate(data):
            with batch.guard(index, "preprocess"):
                protocols = self.protocols_for(index)
                batch.protocols[index] = protocols[-1]  # whose error shape a refusal takes
                try:
                    decoded = self.decode(request, index, protocols)
                except Answered as answered:  # answered without the model
                    batch.answers[index] = answered.body
                    continue
                batch.accepted.append(Accepted(index, decoded, self.tokenized(decoded)))
        return batch

    def tokenized(self, request: Request) -> Tokenized:
        """The request's texts (as the task gives them to the model) tokenized, per its truncation."""
        params = request.params
        truncate, side = params.get("truncate"), params.get("truncation_direction")
        if "token_ids" in request.meta:  # sent as token ids (the OpenAI embeddings body)
            return self.tokenize.ids(request.meta["token_ids"], truncate, side)
        return self.tokenize(self.model_texts(request), truncate, side)

    def model_texts(self, request: Request) -> list:
        """The texts the model reads for a request (a task may prepend a prompt)."""
        return request.texts

    def protocols_for(self, index: int) -> list[Protocol]:
        """The protocols of request `index`'s route; a 404 for a route this model does not serve."""
        route = self.route(index)
        protocols = for_route(route, self.protocols)
        if not protocols:
            raise unknown_route(route, self.protocols)
        return protocols

    def decode(self, request: dict, index: int, protocols: list[Protocol]) -> Request:
        """One request's body, decoded and checked by the first of `protocols` that takes its form."""
        if not protocols[0].reads_body:
            return protocols[0].decode(None, self.spec)
        value = decode(request, self.content_type(index, request))
        protocol = next((protocol for protocol in protocols if protocol.accepts(value)), protocols[-1])
        return protocol.decode(value, self.spec)

    def route(self, index: int) -> str:
        """The request's path after /predictions/{model}[/{version}] (TorchServe's `url_path`)."""
        return (self._header(index, "url_path") or "").strip("/")

    def content_type(self, index: int, request: dict) -> str | None:
        part = "data" if request.get("data") is not None else "body"
        header = self._header(index, part)
        return header.get("content-type") if isinstance(header, dict) else None

    def _header(self, index: int, name: str) -> Any:
        return self.context.get_request_header(index, name) if self.context.request_processor else None

    def inference(self, data: Batch, *args, **kwargs) -> Batch:
        """The engine over the accepted requests' texts; a failing call is split until it is isolated."""

        def run(requests: list[Accepted]) -> None:
            for request, rows in zip(requests, self.run_requests(requests, self.context), strict=True):
                data.outputs[request.index] = rows

        split_until_isolated(data, data.accepted, run)
        return data

    def run_requests(self, requests: list[Accepted], context) -> list[list[torch.Tensor]]:
        """The engine over the requests' texts in one go: each request's output rows, in order."""
        outputs = self.engine.run(
            [ids for request in requests for ids in request.token_ids], type_ids=type_ids_of(requests)
        )
        self.record_traffic(outputs.lengths, outputs.calls, context)
        rows, position = [], 0
        for request in requests:
            rows.append(outputs.rows[position : position + len(request.token_ids)])
            position += len(request.token_ids)
        return rows

    def postprocess(self, data: Batch) -> list[Any]:
        """Each served request's answer, in its protocol's form."""
        served = Served(self.context.model_name, model_version(self.context))
        for accepted in data.live(data.accepted):
            with data.guard(accepted.index, "postprocess"):
                data.answers[accepted.index] = self.respond(accepted, data.outputs[accepted.index], served)
                self.context.set_response_header(accepted.index, USAGE_HEADER, str(accepted.tokens))
        return data.answers

    @staticmethod
    def as_text(answer: Any) -> str:
        return answer if isinstance(answer, str) else json.dumps(answer, allow_nan=False)

    def record_traffic(self, lengths: list[int], calls: list[Call], context=None) -> None:
        """Count live traffic's lengths, padding (pack tails included) and texts per shape; export
        the padded-token ratio since ready."""
        if not (self.initialized and self.engine.model.ready):  # warm-up and re-tracing are not traffic
            return
        context = context or self.context
        self.lengths.record(lengths, buckets.padded_tokens([call.group for call in calls]))
        emit(context, "PaddedTokenRatio", round(self.lengths.padded_ratio, 4), "Ratio")
        prefix = "packed " if self.engine.layout.packed else ""
        for call in calls:
            shape = f"{prefix}{call.group.batch_size}x{call.group.seq_len}"
            count(context, "BucketRequests", shape, len(call.texts))


def type_ids_of(requests: list[Accepted]) -> list[list[int]] | None:
    """The token types of the requests' texts, where any of them is a text pair (else None: all 0)."""
    if all(request.tokenized.type_ids is None for request in requests):
        return None
    return [
        types
        for request in requests
        for types in request.tokenized.type_ids or [[0] * len(ids) for ids in request.token_ids]
    ]


def model_version(context) -> str | None:
    manifest = getattr(context, "manifest", None) or {}
    return manifest.get("model", {}).get("modelVersion")
