"""Tasks as plain objects: what a model reads, which request parameters it takes, what it answers per text.

A task knows nothing of servers or loops. The startup room (handlers/startup/) reads its building
hooks below (the module to compile, the length limit, the bucket plan, the engine); the worker
(handlers/worker/worker.py) reads the rest: `protocols`, `param_checks`, `model_texts` and `answer`.
One subclass per task (handlers/tasks/registry.py names them all): embeddings, sparse embeddings,
multi-vector (ColBERT) embeddings, classification, token classification, generation.
"""

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ts_compiled_handlers.configuration.config import HandlerConfig
from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.engine.engine import Engine, KeptPart
from ts_compiled_handlers.engine.layout import Layout
from ts_compiled_handlers.engine.runner import ModelRunner
from ts_compiled_handlers.protocols import Protocol, Request
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.request.answer_budget import AnswerBudget
from ts_compiled_handlers.request.payload import ParamCheck, boolean_param, choice_param
from ts_compiled_handlers.request.tokenizing import SIDES, Accepted, Tokenized

# One model load at a time in a process: transformers' from_pretrained swaps class-wide functions
# (PreTrainedModel.tie_weights, torch's init functions) for no-ops while it loads, and two loads in
# threads can leave them swapped for good (transformers 5.24; its PR 44940): every later model's
# tied weights (a masked LM's decoder, an LM head) then stay on the meta device.
MODEL_LOADING = threading.RLock()

# Per request: `truncate: false` refuses a text over the limit (413) whatever `buckets.overflow`
# says, `true` cuts it; `truncation_direction` says which end is cut (TEI's and vLLM's names).
TRUNCATION_PARAMS = {"truncate": boolean_param, "truncation_direction": choice_param(*SIDES)}


class Task:
    """The hooks every task shares, with their defaults."""

    NAME = ""  # the task's name in model-config.yaml (`handler.task`) and `hfserve build --task`
    AOT = True  # it may be served from an AOT package (handlers/compiling/aot_package.py)
    PARAMS: dict[str, ParamCheck] = {}
    PER_TOKEN = False  # the model's outputs are per token (token classification), not per text
    PAIRS = False  # the task takes text pairs (a cross-encoder)
    OFFSETS = False  # its answers read each token's characters in the text (entities' spans)
    LABELS = False  # its outputs are scores over labels (the int8 gate counts agreeing labels or ranks)
    # `compile.freezing: auto` may freeze the weights (generation's decode step over a static cache
    # drifted from eager when frozen: GPT-2 by 0.14, so the warm-up check served it eagerly)
    FREEZES = True
    token_values = 0  # a per-token task's values per token in its output rows (its read_settings sets them)
    prompts: dict[str, str] = {}  # the model's named prompts (embedders read theirs in read_settings)
    # A task that cuts or extends its texts' token ids defines `model_ids(request, tokenized) ->
    # Tokenized` (multi-vector queries); None: the tokenizer's ids as they are, and no call for it
    # on the request path (docs/design.md counts the modules that path re-enters).
    model_ids: Callable[[Request, Tokenized], Tokenized] | None = None
    # Tried in order for a request's route; a protocol is one module (handlers/protocols/).
    protocols: tuple[Protocol, ...] = (KServeV2Protocol(), PlainProtocol())

    def __init__(self, config: HandlerConfig, continuous: bool = False):
        self.config = config
        self.continuous = continuous  # generation as a decode loop (handlers/configuration/placement.py)
        # what one answer may take (handlers/request/answer_budget.py), checked before it is made
        self.budget = AnswerBudget(config.max_response_bytes)

    # -- building (handlers/startup/build_steps.py, handlers/startup/aot_start.py) --------------------------------
    def build_model(self, model_dir: Path) -> torch.nn.Module:
        """The float32 module to compile: forward(input_ids, attention_mask) -> (batch, ...)."""
        raise NotImplementedError

    def load_model(self, model_dir: Path) -> torch.nn.Module:
        """`build_model`, never beside another model load of the process (MODEL_LOADING)."""
        with MODEL_LOADING:
            return self.build_model(model_dir)

    def max_seq_len(self, model_dir: Path, config: HandlerConfig) -> int | None:
        """The model's own length limit, if it has one; it caps the largest bucket."""
        return None

    def configure_tokenizer(self, tokenizer) -> None:
        """Task-specific tokenizer settings (e.g. which side truncation cuts)."""

    def tokenizer_options(self) -> dict:
        """How the request path tokenizes the model's texts: handlers/request/tokenizing.py's TextTokenizer
        options (`special_tokens`, `truncates`), read once the task has read the model's settings."""
        return {}

    def read_settings(self, serving) -> None:
        """What the task reads from the model's files besides the module (labels, pooling): a
        worker serving an AOT package never builds the module."""

    def adapt_plan(self, plan: buckets.BucketPlan, config: HandlerConfig, model_config) -> buckets.BucketPlan:
        return plan

    def graphs_needed(self, plan: buckets.BucketPlan) -> int:
        """Graphs the warm-up grid must compile (more means graph breaks or lost guards)."""
        return buckets.expected_graphs(plan)

    def engine(self, model: ModelRunner, serving, dtype: torch.dtype, layout: Layout) -> Engine:
        return Engine(model, layout, serving.plan, dtype, serving.device, serving.pad_id, self.PER_TOKEN)

    # -- requests and answers -------------------------------------------------------------------
    def param_checks(self) -> dict[str, ParamCheck]:
        """The request parameters this task accepts, each with its check: its own, how to truncate,
        and which of the archive's LoRA adapters runs it, where it has any."""
        adapters = {"adapter": choice_param(*self.config.adapters)} if self.config.adapters else {}
        return {**TRUNCATION_PARAMS, **self.PARAMS, **adapters}

    def adapt_body(self, value: Any) -> Any:
        """A task's own request form rewritten to the common one (chat messages to a prompt)."""
        return value

    def check_request(self, request: Request) -> None:
        """Refuse (RequestError) parameters that each pass their check but not together."""

    def model_texts(self, request: Request) -> list:
        """The texts the model reads for a request (a task may prepend a prompt)."""
        return request.texts

    def calibration_inputs(self, texts: list[str], pairs: Callable[[], list[tuple[str, str]]]) -> list:
        """What `quantize` calibrates and gates the model on (handlers/quantizing/calibration.py): the
        calibration texts, or the pairs made of them (`pairs()`: a file's tab-separated lines, read
        as pairs only by a task that takes pairs), as the model reads them."""
        return texts

    def tei_model_type(self) -> dict | None:
        """The model's kind as TEI's `info` names it (None: not one of TEI's)."""
        return None

    def build_side_models(self, serving, dtype: torch.dtype, check_drift, packages) -> None:
        """Build, warm and check (`check_drift(name, outputs, reference, tolerance)`, the startup
        room's) what the task runs beside the engine (an image tower), before ready: from the
        archive's AOT packages of them where `packages` (handlers/compiling/side_packages.py; None
        where compiling is off) loads one that serves."""

    def build_side_packages(self, serving, dtype: torch.dtype, packages) -> dict:
        """Export what `build_side_models` builds into the archive's AOT packages (`packages.build`),
        after the engine's package is built; the builds' timings by name."""
        return {}

    def side_sources(self) -> dict[str, str]:
        """Where each side model serves from (`aot package`, `compiled`, `eager`), by name."""
        return {}

    def with_images(self, requests: list[Accepted], rows: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """Each request's output rows with its images' rows in place (tasks that take images)."""
        return rows

    def images_held(self, accepted: Accepted) -> int:
        """How many images the request holds until it is answered, counted against
        `images_budget` (handlers/request/holding.py) by the loops."""
        return 0

    @property
    def images_budget(self) -> int | None:
        """The most images the worker may hold read and not yet answered; None: no images."""
        return None

    def kept_part(self, accepted: Accepted) -> KeptPart | None:
        """The part of each of the request's output rows its answer reads, where a per-token task
        reads less than all (handlers/engine/engine.py); None: whole rows."""
        return None

    def rows_held(self, accepted: Accepted) -> int:
        """Bytes of output rows the request holds from its call until it is answered, counted
        against `handler.max_held_bytes` by the loops: a per-token task's grow with its tokens
        (float32 rows of `token_values` each, or the part its answer reads); a pooled task's, a
        vector per text, are not counted."""
        kept = self.kept_part(accepted)
        if kept is None:
            return accepted.tokens * self.token_values * 4
        return kept.held_bytes(accepted.token_ids, self.token_values)

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        """One answer per text of the request, from its output rows (one per text, in order)."""
        raise NotImplementedError
