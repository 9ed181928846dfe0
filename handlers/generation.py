"""Text generation with a static KV cache and a compiled decode step; tokens stream as JSON lines.

Two ways to batch, chosen by TorchServe's own `continuousBatching` key of model-config.yaml:
- continuous (`true`): prompts hold slots of a running decode loop, joining and leaving it between
  steps (handlers/continuous.py, handlers/slots.py): one compiled step of shape (slots, 1);
- request batches (`false`): the prompts of a TorchServe batch generate together (up to the largest
  batch bucket per group) to the end of the longest: a compiled step per batch bucket.
Each prompt has its own parameters, stop strings and token budget; greedy output equals what
`model.generate()` gives for the prompt alone, either way.
"""

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from ts.handler_utils.utils import send_intermediate_predict_response

from handlers import buckets
from handlers.base import CompiledHandler
from handlers.batch import Accepted, Batch, split_until_isolated
from handlers.continuation import Continuation, Job
from handlers.continuous import DecodeLoop
from handlers.decoding import CachePool, DecodeStep, GroupDecoder, left_pad
from handlers.metrics import emit
from handlers.payload import RequestError, boolean_param, int_param, is_unicode_text, number_param
from handlers.sampling import Sampler
from handlers.slots import SlotCache, SlotStep

MAX_STOP_LENGTH = 64
ROLES = ("system", "user", "assistant")


def check_messages(messages: Any) -> list[dict[str, str]]:
    """A non-empty list of {"role": system | user | assistant, "content": text}."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, '\'messages\' must be a non-empty list of {"role", "content"} objects')
    for position, message in enumerate(messages):
        if not (isinstance(message, dict) and set(message) == {"role", "content"}):
            raise RequestError(400, f"'messages'[{position}] must be an object with exactly 'role' and 'content'")
        if message["role"] not in ROLES or not isinstance(message["content"], str):
            raise RequestError(400, f"'messages'[{position}]: role is one of {', '.join(ROLES)}, content a string")
        if not is_unicode_text(message["content"]):
            raise RequestError(400, f"'messages'[{position}] holds a lone surrogate, not Unicode text")
    return messages


class GenerationHandler(CompiledHandler):
    """`{"inputs": "prompt", "max_new_tokens": 20}` -> `{"generated_text": ..., "finish_reason": ...}`."""

    # -- configuration ----------------------------------------------------------------------
    def load_settings(self, context) -> None:
        self.continuous = bool((context.model_yaml_config or {}).get("continuousBatching", False))
        super().load_settings(context)

    def read_task_settings(self, model_dir: Path, model_config) -> None:
        text_config = model_config.get_text_config()
        windowed = getattr(text_config, "sliding_window", None) or "sliding_attention" in (
            getattr(text_config, "layer_types", None) or []
        )
        if self.continuous and windowed:  # a slot holds every position; a window would drop some
            raise ValueError(
                "continuous batching does not serve sliding-window attention; set continuousBatching: false"
            )

    def initialize(self, context):
        super().initialize(context)
        limits = self.config.generation
        if self.continuous:
            self.loop = DecodeLoop(self, self.plan.max_batch, limits.steps_per_call, limits.max_request_seconds)

    def configure_tokenizer(self, tokenizer) -> None:
        tokenizer.truncation_side = "left"  # an over-long prompt keeps its end, which generation continues

    def max_seq_len(self, model_dir: Path) -> int | None:
        positions = AutoConfig.from_pretrained(model_dir, trust_remote_code=False).max_position_embeddings
        return positions - self.config.generation.max_new_tokens

    def _plan(self, model_dir: Path) -> buckets.BucketPlan:
        """Static shapes always: the decode step's shapes are fixed by its cache, one graph per batch bucket."""
        return dataclasses.replace(super()._plan(model_dir), dynamic="none", pack_tokens=None)

    def graphs_needed(self) -> int:
        return 1 if self.continuous else len(self.plan.batch_sizes)

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
        """`{"messages": [{"role", "content"}, ...]}` -> `{"inputs": the tokenizer's chat prompt}`."""
        if not (isinstance(value, dict) and "messages" in value):
            return value
        if "inputs" in value:
            raise RequestError(400, "send 'inputs' (a prompt) or 'messages' (a chat), not both")
        if not self.tokenizer.chat_template:
            raise RequestError(400, "this model's tokenizer has no chat template: send 'inputs' (a prompt) instead")
        messages = check_messages(value["messages"])
        try:
            prompt = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as error:  # the template's own checks (roles, order) raise what they like
            raise RequestError(
                400, f"the model's chat template refused these messages ({type(error).__name__})"
            ) from None
        bos = self.tokenizer.bos_token
        if bos and prompt.startswith(bos) and self._special_ids()[0] == self.tokenizer.bos_token_id:
            prompt = prompt[len(bos) :]  # tokenizing adds it again
        return {**{key: item for key, item in value.items() if key != "messages"}, "inputs": prompt}

    def _stop_param(self, value: Any, name: str) -> list[str]:
        stops = [value] if isinstance(value, str) else value
        limit = self.config.generation.max_stop_strings
        if not isinstance(stops, list) or len(stops) > limit:
            raise RequestError(400, f"parameter '{name}' must be a string or a list of at most {limit} strings")
        if not all(isinstance(stop, str) and 0 < len(stop) <= MAX_STOP_LENGTH for stop in stops):
            raise RequestError(400, f"parameter '{name}': each stop string must have 1 to {MAX_STOP_LENGTH} characters")
        if not all(is_unicode_text(stop) for stop in stops):
            raise RequestError(400, f"parameter '{name}': a stop string holds a lone surrogate, not Unicode text")
        return stops

    # -- model ------------------------------------------------------------------------------
    def build_model(self, model_dir: Path) -> torch.nn.Module:
        lm = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False
        )
        defaults = lm.generation_config
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
        self.caches = CachePool(lm.config, self.plan.max_seq_len + self.config.generation.max_new_tokens)
        self.slot_caches: dict[torch.dtype, SlotCache] = {}
        return SlotStep(lm) if self.continuous else DecodeStep(lm)

    def _slot_cache(self, dtype: torch.dtype) -> SlotCache:
        """The one slot cache of a dtype: the compiled step's guards hold on to it."""
        if dtype not in self.slot_caches:
            config, length = self.caches.lm_config, self.caches.cache_len
            self.slot_caches[dtype] = SlotCache(config, self.plan.max_batch, length, dtype, self.device)
        return self.slot_caches[dtype]

    def prefill(self, ids: list[int], slot: int) -> torch.Tensor:
        """A prompt alone into `slot` of the live slot cache; its next-token logits."""
        with torch.inference_mode():
            return self.model.eager.prefill(ids, self._slot_cache(self.dtype), slot)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One compiled step over every slot of the live slot cache; logits (slots, vocab)."""
        cache = self._slot_cache(self.dtype)
        with torch.inference_mode():  # fresh tensors, made as warm-up made them: dynamo's guards see alike
            positions = positions.to(self.device, copy=True)
            cache.positions.copy_(positions)
            inputs = {"input_ids": tokens.view(-1, 1).to(self.device, copy=True), "positions": positions}
            return self.model({**inputs, "cache": cache})

    def _decoder(self, group: buckets.Group, token_ids: list[list[int]], model) -> GroupDecoder:
        dtype = next(model.eager.parameters()).dtype
        cache = self.caches.get(group.batch_size, dtype)
        tensors = left_pad(token_ids, group.batch_size, group.seq_len, self.caches.cache_len, self.pad_id)
        return GroupDecoder(model, cache, *tensors, self.device)

    def checked_outputs(self, token_ids: list[list[int]], model=None) -> list[torch.Tensor]:
        """A request runs a decode loop, not one pass: warm-up and the checks run its first two
        steps. Per prompt: the prefill's logits and one greedy decode step's, joined."""
        model = model or self.model
        if self.continuous:
            return self._first_two_steps_in_slots(token_ids, model)
        rows: list[torch.Tensor | None] = [None] * len(token_ids)
        with torch.inference_mode():
            for group in buckets.generation_groups([len(ids) for ids in token_ids], self.plan):
                decoder = self._decoder(group, [token_ids[i] for i in group.indices], model)
                first = decoder.prefill()
                second = decoder.step(first.argmax(dim=-1))
                joined = torch.cat([first, second], dim=-1).float().cpu()
                for row, index in enumerate(group.indices):
                    rows[index] = joined[row]
        return rows

    def _first_two_steps_in_slots(self, token_ids: list[list[int]], model) -> list[torch.Tensor]:
        """`checked_outputs` through the slot cache: up to `slots` prompts prefilled, then one step over all."""
        slots = self.plan.max_batch
        cache = self._slot_cache(next(model.eager.parameters()).dtype)
        rows = []
        with torch.inference_mode():
            for start in range(0, len(token_ids), slots):
                tokens = torch.full((slots, 1), self.pad_id, dtype=torch.long, device=self.device)
                positions = torch.zeros(slots, dtype=torch.long, device=self.device)
                first = []
                for slot, ids in enumerate(token_ids[start : start + slots]):
                    first.append(model.eager.prefill(ids, cache, slot))
                    tokens[slot, 0], positions[slot] = first[-1].argmax(), len(ids)
                cache.positions.copy_(positions)
                second = model({"input_ids": tokens, "positions": positions, "cache": cache})
                rows += [torch.cat([row, second[slot]]).float().cpu() for slot, row in enumerate(first)]
        return rows

    # -- requests ---------------------------------------------------------------------------
    def handle(self, data, context):
        """Request batches as every task; with continuous batching, one call of the decode loop."""
        if not self.continuous:
            return super().handle(data, context)
        self.context = context
        if self.loop.idle:  # re-tracing the grid writes the slot cache
            self.follow_worker_count()
        answers = self.loop.call(data, context)
        emit(context, "RecompilesAfterReady", self.model.recompiles_after_ready, "Count")
        return answers

    def final_text(self, request: Accepted, jobs: list[Job]) -> str:
        """A request's final answer as sent: JSON, or JSON lines when it streams."""
        answer = self._final_answer(request, jobs)
        return answer if isinstance(answer, str) else json.dumps(answer)

    def prepare(self, token_ids: list[list[int]]) -> list[buckets.Group]:
        """Prompt buckets; each group is left-padded into its static cache when it runs."""
        return buckets.generation_groups([len(ids) for ids in token_ids], self.plan)

    def inference(self, data: Batch, *args, **kwargs) -> Batch:
        """Generate for every accepted prompt; a failing group is split until the failing request is alone."""
        for request in data.accepted:
            if request.body.params.get("stream", False):
                self.context.set_response_content_type(request.index, "application/jsonl")
        split_until_isolated(data, data.accepted, lambda requests: self._generate_for(data, requests))
        return data

    def answer(self, request: Accepted, outputs: list[Job]) -> Any:
        return self._final_answer(request, outputs)

    def _generate_for(self, batch: Batch, requests: list[Accepted]) -> None:
        jobs = [
            self._job(request, position, encoding.ids)
            for request in requests
            for position, encoding in enumerate(request.encodings)
        ]
        groups = batch.take_prepared() or self.prepare([job.ids for job in jobs])
        self.record_padding([len(job.ids) for job in jobs], groups)
        try:
            for group in groups:
                self._generate([jobs[i] for i in group.indices], group)
        except Exception as error:
            # A request that already streamed text cannot start again: it ends here with its error.
            for job in jobs:
                if job.continuation.streamed:
                    batch.fail(job.request.index, "inference", error)
            raise
        for request in requests:
            batch.outputs[request.index] = [job for job in jobs if job.request is request]

    def _job(self, request: Accepted, position: int, ids: list[int]) -> Job:
        params = request.body.params
        sampling = {name: params.get(name, default) for name, default in self.sampling_defaults.items()}
        continuation = Continuation(
            self.tokenizer,
            params.get("max_new_tokens", self.default_new_tokens),
            params.get("stop", []),
            self.eos_ids,
        )
        return Job(request, position, ids, continuation, Sampler(**sampling, seed=params.get("seed")))

    def _generate(self, jobs: list[Job], group: buckets.Group) -> None:
        with torch.inference_mode():
            decoder = self._decoder(group, [job.ids for job in jobs], self.model)
            logits = decoder.prefill().float().cpu()
            while True:
                tokens = torch.full((group.batch_size,), self.pad_id, dtype=torch.long)
                for row, job in enumerate(jobs):
                    if not job.continuation.finished:
                        tokens[row] = job.sampler.choose(logits[row])
                        job.continuation.add(int(tokens[row]))
                self._stream(jobs)
                if all(job.continuation.finished for job in jobs):
                    return
                logits = decoder.step(tokens).float().cpu()

    def _stream(self, jobs: list[Job]) -> None:
        """Send the new text of streaming prompts, one chunk of JSON lines per request."""
        chunks: dict[int, str] = {}
        for job in jobs:
            piece = job.continuation.pending() if job.streams and not job.continuation.finished else ""
            if piece:
                line = json.dumps({"index": job.position, "text": piece}) + "\n"
                chunks[job.request.index] = chunks.get(job.request.index, "") + line
        if chunks:
            request_ids = {index: self.context.request_ids[index] for index in chunks}
            send_intermediate_predict_response(
                chunks, request_ids, "Intermediate Prediction success", 200, self.context
            )

    @staticmethod
    def _result(job: Job) -> dict[str, Any]:
        return {
            "generated_text": job.continuation.text,
            "finish_reason": job.continuation.finish_reason,
            "generated_tokens": len(job.continuation.ids),
        }

    def _final_answer(self, request: Accepted, jobs: list[Job]) -> Any:
        if not request.body.params.get("stream", False):
            return request.body.shape_like_inputs([self._result(job) for job in jobs])
        lines = []
        for job in jobs:
            piece = job.continuation.pending()
            if piece:
                lines.append({"index": job.position, "text": piece})
            lines.append({"index": job.position, **self._result(job)})
        return "".join(json.dumps(line) + "\n" for line in lines)
