"""OpenAI's `v1/completions` and `v1/chat/completions` for text-generation archives.

A body becomes the generation task's own parameters: `max_tokens` (or `max_completion_tokens`)
is `max_new_tokens`, `temperature` 0 is greedy and above 0 samples, `top_p`, `seed` and `stop` as
they are; left out, they take the model's generation config, as vLLM does. `n` above 1, `echo`,
`logprobs`, `suffix`, penalties, `logit_bias`, tools and non-text response formats get a 400 that
names the field. `stream: true` answers server-sent events (`data: {chunk}` ... `data: [DONE]`),
one event per piece of text as the decode loop makes it, a last chunk per prompt with its
`finish_reason` (`stop` or `length`), and `usage` when `stream_options.include_usage` is true.
Chat turns `messages` into a prompt with the tokenizer's chat template (handlers/tasks/chat.py).
"""

import dataclasses
import json
import time
import uuid
from typing import Any

from ts_compiled_handlers.protocols import Request, RequestSpec, Served
from ts_compiled_handlers.protocols.openai import OpenAIProtocol, refuse_unserved
from ts_compiled_handlers.request.answers import Generated
from ts_compiled_handlers.request.payload import RequestError, check_params, check_texts

# OpenAI fields that are served only at their neutral value (anything else: a 400 naming them).
NEUTRAL = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "suffix": (None, ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
}
# Read here (or ignored: `user`), never passed on as the task's parameters.
OWN_FIELDS = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "stream_options"}
OWN_FIELDS |= {"user", *NEUTRAL}


@dataclasses.dataclass(frozen=True)
class CompletionForm:
    completion_id: str
    created: int
    model: str
    include_usage: bool
    started: set[int] = dataclasses.field(default_factory=set)  # prompts whose first chunk went out


class CompletionsProtocol(OpenAIProtocol):
    """`POST v1/completions`: `prompt` a string or a list of strings, one choice per prompt."""

    routes = ("v1/completions",)
    texts_field = "prompt"
    stream_content_type = "text/event-stream"
    id_prefix, object_name, chunk_object = "cmpl", "text_completion", "text_completion"

    def prompts(self, value: dict, spec: RequestSpec) -> tuple[list[str], dict]:
        """The prompts of the body and what is left of it."""
        prompt = value.get("prompt")
        if isinstance(prompt, str):
            prompt = [prompt]
        if not isinstance(prompt, list) or not all(isinstance(item, str) for item in prompt):
            raise RequestError(
                400, "'prompt' must be a string or a list of strings (token-id prompts are not served)", "prompt"
            )
        return check_texts(prompt, spec.max_inputs, "prompt"), value

    def read(self, value: Any, spec: RequestSpec) -> Request:
        value = {key: item for key, item in self.body_object(value, spec).items() if item is not None}  # null: default
        refuse_unserved(value, NEUTRAL)
        texts, value = self.prompts(value, spec)
        params = check_params({key: item for key, item in value.items() if key not in OWN_FIELDS}, spec.params)
        params.update(sampling(value, spec))
        options = value.get("stream_options") or {}
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise RequestError(
                400, "'stream_options' must be an object with include_usage true or false", "stream_options"
            )
        completion_id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        form = CompletionForm(completion_id, int(time.time()), spec.model_name, options.get("include_usage", False))
        return Request(texts, params, self, form=form)

    # -- answers ------------------------------------------------------------------------------
    def choice(self, index: int, text: str, finish_reason: str | None) -> dict:
        return {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": None}

    def delta(self, index: int, text: str, finish_reason: str | None, first: bool) -> dict:
        return self.choice(index, text, finish_reason)

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        choices = [self.choice(index, one.generated_text, one.finish_reason) for index, one in enumerate(answers)]
        body = self.envelope(request, self.object_name)
        return {**body, "choices": choices, "usage": usage(answers, prompt_tokens)}

    @staticmethod
    def envelope(request: Request, object_name: str) -> dict:
        form = request.form
        return {"id": form.completion_id, "object": object_name, "created": form.created, "model": form.model}

    def stream_pieces(self, request: Request, pieces: list[tuple[int, str]]) -> str:
        started = request.form.started
        events = []
        for index, piece in pieces:
            if piece or index not in started:
                events.append(self.event(request, [self.delta(index, piece, None, index not in started)]))
                started.add(index)
        return "".join(events)

    def stream_end(
        self, request: Request, pieces: list[tuple[int, str]], results: list[Generated], prompt_tokens=0
    ) -> str:
        events = [self.stream_pieces(request, pieces)]
        for (index, _), result in zip(pieces, results, strict=True):
            events.append(self.event(request, [self.delta(index, "", result.finish_reason, False)]))
        if request.form.include_usage:
            events.append(self.event(request, [], usage=usage(results, prompt_tokens)))
        return "".join(events) + "data: [DONE]\n\n"

    def event(self, request: Request, choices: list[dict], **extra) -> str:
        chunk = {**self.envelope(request, self.chunk_object), "choices": choices, **extra}
        return f"data: {json.dumps(chunk)}\n\n"


class ChatCompletionsProtocol(CompletionsProtocol):
    """`POST v1/chat/completions`: `messages` through the chat template, one assistant message back."""

    routes = ("v1/chat/completions",)
    texts_field = "messages"
    id_prefix, object_name, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def prompts(self, value: dict, spec: RequestSpec) -> tuple[list[str], dict]:
        if "prompt" in value:
            raise RequestError(400, "'prompt' belongs to v1/completions; chat takes 'messages'", "prompt")
        messages = value.get("messages")
        if isinstance(messages, list):
            messages = [plain_message(message, position) for position, message in enumerate(messages)]
        adapted = spec.adapt({"messages": messages})
        return check_texts([adapted["inputs"]], 1, "messages"), value

    def choice(self, index: int, text: str, finish_reason: str | None) -> dict:
        message = {"role": "assistant", "content": text}
        return {"index": index, "message": message, "finish_reason": finish_reason, "logprobs": None}

    def delta(self, index: int, text: str, finish_reason: str | None, first: bool) -> dict:
        delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": None}


def plain_message(message: Any, position: int) -> Any:
    """A message as the chat template takes it: `developer` is `system`, text parts joined, `name` dropped."""
    if not isinstance(message, dict):
        return message
    message = {key: item for key, item in message.items() if key != "name"}
    if message.get("role") == "developer":
        message["role"] = "system"
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(part, dict) and part.get("type") == "text" for part in content):
            raise RequestError(400, f"'messages'[{position}]: only text content parts are served", "messages")
        message["content"] = "".join(str(part.get("text", "")) for part in content)
    return message


def sampling(value: dict, spec: RequestSpec) -> dict:
    """The task's sampling parameters from OpenAI's names."""
    params = {}
    if "max_tokens" in value and "max_completion_tokens" in value:
        raise RequestError(400, "'max_tokens' and 'max_completion_tokens' say the same: send one", "max_tokens")
    budget = value.get("max_completion_tokens", value.get("max_tokens"))
    if budget is not None:
        params["max_new_tokens"] = spec.params["max_new_tokens"](budget, "max_tokens")
    temperature = value.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise RequestError(400, "'temperature' must be a number from 0 to 2", "temperature")
        params["do_sample"] = temperature > 0
        if temperature > 0:
            params["temperature"] = float(temperature)
    return params


def usage(results: list[Generated], prompt_tokens: int) -> dict:
    completion = sum(result.generated_tokens for result in results)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
