"""Text generation with a static KV cache and a compiled decode step: the prompts, their parameters, their answers.

Two loops serve it, chosen where the worker sits (handlers/configuration/placement.py: TorchServe's
`continuousBatching`; a Ray replica always runs the decode loop):
- continuous (`true`): prompts hold slots of a running decode loop, joining and leaving it between
  steps (handlers/loops/decode_loop.py, handlers/engine/kv_slots.py): one compiled step of shape (slots, 1);
- request batches (`false`): the prompts of a batch generate together (up to the largest batch
  bucket per group) to the end of the longest (handlers/loops/generation_batches.py,
  handlers/engine/static_decoding.py): a compiled step per batch bucket.
Each prompt has its own parameters, stop strings and token budget (a `Job`); greedy output equals
what `model.generate()` gives for the prompt alone, either way. Answers and streamed pieces take
the form of the request's protocol (JSON lines for this package's own bodies).
"""

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from ts_compiled_handlers.configuration.config import HandlerConfig
from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.engine.decode_step import DecodeStep
from ts_compiled_handlers.engine.decoder import DecoderEngine
from ts_compiled_handlers.engine.kv_slots import SlotStep
from ts_compiled_handlers.engine.layout import Layout
from ts_compiled_handlers.engine.runner import ModelRunner
from ts_compiled_handlers.engine.sampling import Sampler
from ts_compiled_handlers.engine.static_decoding import CachePool
from ts_compiled_handlers.protocols import Served
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.openai import ModelsProtocol
from ts_compiled_handlers.protocols.openai_generation import ChatCompletionsProtocol, CompletionsProtocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.request.payload import RequestError, boolean_param, int_param, is_unicode_text, number_param
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.tasks.chat import messages_to_inputs
from ts_compiled_handlers.tasks.continuation import Continuation, Job

if TYPE_CHECKING:  # the startup room builds what a task reads; a task only reads it
    from ts_compiled_handlers.startup.serving import Serving


MAX_STOP_LENGTH = 64
AUTO_PROMPT_TOKENS = 256  # the largest prompt bucket of `seq_lens: auto` (see adapt_plan)


def refuse_sliding_window(model_config, continuous: bool) -> None:
    """A slot holds every position of its prompt; a sliding window would drop some."""
    text_config = model_config.get_text_config()
    layer_types = getattr(text_config, "layer_types", None) or []
    windowed = getattr(text_config, "sliding_window", None) or "sliding_attention" in layer_types
    if continuous and windowed:
        raise ValueError("continuous batching does not serve sliding-window attention; set continuousBatching: false")


class GenerationTask(Task):
    """`{"inputs": "prompt", "max_new_tokens": 20}` -> `{"generated_text": ..., "finish_reason": ...}`."""

    NAME = "text-generation"
    AOT = False  # the decode step over a static KV cache is compiled, never exported
    FREEZES = False

    protocols = (
        KServeV2Protocol(),
        PlainProtocol(),
        CompletionsProtocol(),
        ChatCompletionsProtocol(),
        ModelsProtocol(),
    )

    # -- configuration and model ------------------------------------------------------------
    def read_settings(self, serving: "Serving") -> None:
        self.tokenizer = serving.tokenizer
        refuse_sliding_window(serving.model_config, self.continuous)
        if (serving.model_dir / "generation_config.json").is_file():
            defaults = GenerationConfig.from_pretrained(serving.model_dir)
        else:
            defaults = GenerationConfig.from_model_config(serving.model_config)
        eos = defaults.eos_token_id if defaults.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.sampling_defaults = {
            "do_sample": bool(defaults.do_sample),
            "temperature": defaults.temperature or 1.0,
            "top_k": defaults.top_k or 0,
            "top_p": defaults.top_p or 1.0,
        }
        limits = self.config.generation
        self.default_new_tokens = limits.default_new_tokens or min(20, limits.max_new_tokens)

    def configure_tokenizer(self, tokenizer) -> None:
        tokenizer.truncation_side = "left"  # an over-long prompt keeps its end, which generation continues

    def max_seq_len(self, model_dir: Path, config: HandlerConfig) -> int | None:
        positions = AutoConfig.from_pretrained(model_dir, trust_remote_code=False).max_position_embeddings
        return positions - config.generation.max_new_tokens

    def adapt_plan(self, plan: buckets.BucketPlan, config: HandlerConfig, model_config) -> buckets.BucketPlan:
        """Static shapes always: the decode step's shapes are fixed by its cache, one graph per batch
        bucket. `seq_lens: auto` stops at 256 prompt tokens: every decode step reads the whole cache."""
        seq_lens = plan.seq_lens
        if config.buckets.seq_lens == "auto" and seq_lens[-1] > AUTO_PROMPT_TOKENS:
            seq_lens = tuple(length for length in seq_lens if length < AUTO_PROMPT_TOKENS) + (AUTO_PROMPT_TOKENS,)
        return dataclasses.replace(plan, seq_lens=seq_lens, dynamic="none", pack_tokens=None, max_tokens=None)

    def graphs_needed(self, plan: buckets.BucketPlan) -> int:
        return 1 if self.continuous else len(plan.batch_sizes)

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        lm = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        return SlotStep(lm) if self.continuous else DecodeStep(lm)

    def engine(self, model: ModelRunner, serving: "Serving", dtype: torch.dtype, layout: Layout) -> DecoderEngine:
        plan = serving.plan
        cache_len = plan.max_seq_len + serving.config.generation.max_new_tokens
        caches = CachePool(serving.model_config, cache_len, plan.max_batch, dtype, serving.device)
        return DecoderEngine(model, plan, dtype, serving.device, serving.pad_id, caches, self.continuous)

    # -- requests ---------------------------------------------------------------------------
    def param_checks(self) -> dict:
        return {
            "max_new_tokens": int_param(1, self.config.generation.max_new_tokens),
            "do_sample": boolean_param,
            "temperature": number_param(0.0, 100.0),
            "top_k": int_param(0, len(self.tokenizer)),
            "top_p": number_param(0.0, 1.0),
            "seed": int_param(0, 2**63 - 1),
            "stop": self._stop_param,
            "stream": boolean_param,
        }

    def adapt_body(self, value: Any) -> Any:
        return messages_to_inputs(self.tokenizer, value)

    def _stop_param(self, value: Any, name: str) -> list[str]:
        stops = [value] if isinstance(value, str) else value
        limit = self.config.generation.max_stop_strings
        if not isinstance(stops, list) or len(stops) > limit:
            raise RequestError(400, f"parameter '{name}' must be a string or a list of at most {limit} strings", name)
        if not all(isinstance(stop, str) and 0 < len(stop) <= MAX_STOP_LENGTH for stop in stops):
            raise RequestError(
                400, f"parameter '{name}': each stop string must have 1 to {MAX_STOP_LENGTH} characters", name
            )
        if not all(is_unicode_text(stop) for stop in stops):
            raise RequestError(400, f"parameter '{name}': a stop string holds a lone surrogate, not Unicode text", name)
        return stops

    def jobs(self, accepted: Accepted) -> list[Job]:
        """The request's prompts, each with its own budget, stop strings and sampler."""
        params = accepted.request.params
        sampling = {name: params.get(name, default) for name, default in self.sampling_defaults.items()}
        budget = params.get("max_new_tokens", self.default_new_tokens)
        return [
            Job(
                accepted,
                position,
                ids,
                Continuation(self.tokenizer, budget, params.get("stop", []), self.eos_ids),
                Sampler(**sampling, seed=params.get("seed")),
            )
            for position, ids in enumerate(accepted.token_ids)
        ]

    # -- answers ----------------------------------------------------------------------------
    @staticmethod
    def content_type(accepted: Accepted) -> str:
        request = accepted.request
        streams = request.params.get("stream", False)
        return request.protocol.stream_content_type if streams else request.protocol.content_type

    @staticmethod
    def chunk_text(jobs: list[Job], include_finished: bool = True) -> str:
        """The new text of a streaming request's prompts (all, or only those still running)."""
        request = jobs[0].accepted.request
        if not request.params.get("stream", False):
            return ""
        pieces = [
            (job.position, job.continuation.pending())
            for job in jobs
            if include_finished or not job.continuation.finished
        ]
        return request.protocol.stream_pieces(request, pieces)

    @staticmethod
    def final(jobs: list[Job], served: Served) -> Any:
        """A request's final answer: its protocol's body, or the end of its stream."""
        accepted = jobs[0].accepted
        request, results = accepted.request, [job.result() for job in jobs]
        if not request.params.get("stream", False):
            return request.protocol.encode(request, results, served, accepted.tokens)
        pieces = [(job.position, job.continuation.pending()) for job in jobs]
        return request.protocol.stream_end(request, pieces, results, accepted.tokens)
