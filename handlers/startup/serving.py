"""What a worker serves, read from the archive before any model is built, and the contract with the task.

A server says where a worker sits (`Placement`: the archive's folder, the model's name, its
model-config.yaml, the batch size, the GPU); `read_serving(placement, task)` reads the
configuration, shares the cores, loads the tokenizer and plans the buckets; the steps that build
the engine (handlers/startup/build_steps.py, handlers/startup/aot_start.py) take the `Serving` it returns and a task,
of which they need only its building hooks (handlers/tasks/__init__.py).
"""

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoTokenizer

from ts_compiled_handlers.engine import buckets, packing
from ts_compiled_handlers.runtime import hardware, process_settings
from ts_compiled_handlers.startup import compile_cache, warmup
from ts_compiled_handlers.startup.config import CompileConfig, HandlerConfig, check_async_batch_size

if TYPE_CHECKING:  # the tasks' own modules read Serving
    from ts_compiled_handlers.tasks import Task

logger = logging.getLogger(__name__)

AUTO_SMALLEST = 16  # the smallest length bucket of `seq_lens: auto`
AUTO_MAX_TOKENS = 4096  # `max_tokens: auto`: 8 rows of 512, the default grid's 8 x 256 uncut
UNSET_LIMIT = 1_000_000  # a tokenizer's model_max_length at or above this says nothing (transformers' 1e30)
# Model types whose position ids count from past the padding index (RoBERTa's family).
POSITIONS_PAST_PADDING = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text")

HARDWARE = hardware.detect()


@dataclasses.dataclass(frozen=True)
class Placement:
    """What a server tells a worker about itself, in plain values (TorchServe's context, a Ray
    replica's arguments)."""

    model_dir: Path
    model_name: str
    yaml_config: dict
    model_version: str | None = None
    batch_size: int | None = None  # as registered; None where the server does not batch requests
    gpu_id: int | None = None


@dataclasses.dataclass(frozen=True)
class Serving:
    """What a worker serves, read from the archive before any model is built."""

    config: HandlerConfig
    model_dir: Path
    device: torch.device
    tokenizer: Any
    model_config: Any  # transformers' config of the model
    plan: buckets.BucketPlan
    compile_options: CompileConfig  # the configured ones, `dynamic` as the plan has it
    probes: warmup.Probes

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def tolerance(self, dtype: torch.dtype) -> float:
        return warmup.tolerance(self.config.warmup.tolerance, dtype)


@dataclasses.dataclass(frozen=True)
class Started:
    """How the engine came to be: the warm-up's report, where its compiled code came from
    (CACHE_SOURCES), the seconds until the model was loaded, and the host cache it compiled into."""

    report: warmup.WarmupReport
    cache_source: str
    load_seconds: float
    host_cache: compile_cache.HostCache | None = None


def read_serving(placement: Placement, task: "Task") -> tuple[Serving, process_settings.ThreadShare]:
    """Configuration, this worker's share of the cores, tokenizer and bucket plan."""
    config = task.config  # parsed once, when the task was made
    if config.asynchronous:
        check_async_batch_size(placement.batch_size)  # a registration's own too
    model_dir = Path(placement.model_dir)
    threads = process_settings.share_cores(config.threads, config.workers, model_dir)
    gpu_id = placement.gpu_id
    device = torch.device(f"cuda:{gpu_id}" if HARDWARE.device == "cuda" and gpu_id is not None else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    if not tokenizer.is_fast:
        raise ValueError(f"{model_dir} has no fast tokenizer (tokenizer.json); offsets and speed need one")
    task.configure_tokenizer(tokenizer)
    model_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    check_vocabulary(tokenizer, model_config)
    plan = task_plan(task, config, model_dir, tokenizer, model_config)
    options = dataclasses.replace(config.compile, dynamic=plan.dynamic)
    serving = Serving(config, model_dir, device, tokenizer, model_config, plan, options, warmup.Probes(tokenizer, plan))
    return serving, threads


def check_vocabulary(tokenizer, model_config) -> None:
    """A token id past the embedding table aborts the whole worker inside a compiled kernel."""
    rows = model_config.get_text_config().vocab_size
    largest = max(tokenizer.get_vocab().values())
    if rows is not None and largest >= rows:
        raise ValueError(f"the tokenizer makes token id {largest} but the model embeds only {rows} tokens")


def task_plan(task: "Task", config: HandlerConfig, model_dir: Path, tokenizer=None, model_config=None):
    """The bucket plan a worker of `task` serves this model with (the build estimates with it too)."""
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model_config = model_config or AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    limit = length_limit(task.max_seq_len(model_dir, config), tokenizer, model_config)
    return task.adapt_plan(bucket_plan(config, limit), config)


def length_limit(own: int | None, tokenizer, model_config) -> int:
    """The longest text the model takes, as its reference library cuts it: the task's own limit
    (sentence-transformers' `max_seq_length`), the tokenizer's `model_max_length` and the position
    table, whichever is smallest."""
    text_config = model_config.get_text_config()
    positions = getattr(text_config, "max_position_embeddings", None)
    if positions and text_config.model_type in POSITIONS_PAST_PADDING:
        positions -= (text_config.pad_token_id or 0) + 1  # their first position id is padding_idx + 1
    stated = tokenizer.model_max_length if tokenizer.model_max_length < UNSET_LIMIT else None
    known = [limit for limit in (own, stated, positions) if limit]
    if not known:
        raise ValueError("the model states no length limit (max_seq_length, model_max_length, position table)")
    return min(known)


def doubling(top: int, smallest: int = AUTO_SMALLEST) -> tuple[int, ...]:
    """`smallest`, twice that, ... below `top`, then `top`."""
    seq_lens = []
    while smallest < top:
        seq_lens.append(smallest)
        smallest *= 2
    return (*seq_lens, top)


def bucket_plan(config: HandlerConfig, limit: int) -> buckets.BucketPlan:
    """The configured grid (`auto`: doubling up to the model's `limit`; a list capped at it), the
    pack budget and the most tokens per call."""
    seq_lens = config.buckets.seq_lens
    if seq_lens == "auto":
        seq_lens = doubling(limit)
    elif seq_lens[-1] > limit:
        seq_lens = tuple(length for length in seq_lens if length < limit) + (limit,)
        logger.info("Length buckets capped at the model's limit of %d tokens: %s", limit, seq_lens)
    elif seq_lens[-1] < limit:
        logger.warning(
            "Texts are cut at %d tokens (buckets.seq_lens), below the model's own limit of %d: longer texts are "
            "answered otherwise than its reference library answers them (seq_lens: auto reaches the limit)",
            seq_lens[-1],
            limit,
        )
    pack = config.buckets.pack_tokens
    budget = None if pack == "off" else min(seq_lens[-1], packing.AUTO_BUDGET if pack == "auto" else pack)
    most = config.buckets.max_tokens
    max_tokens = AUTO_MAX_TOKENS if most == "auto" else most
    return buckets.BucketPlan(seq_lens, config.buckets.batch_sizes, config.compile.dynamic, budget, max_tokens)
