"""The bucket plan a worker serves a model with: the length buckets up to the model's own limit, the
pack budget and the most tokens per call, from the configuration (the build estimates with it too)."""

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import AutoConfig, AutoTokenizer

from ts_compiled_handlers.configuration.config import HandlerConfig
from ts_compiled_handlers.engine import buckets, packing

if TYPE_CHECKING:  # a task reads the plan's settings; it is made before any task's module
    from ts_compiled_handlers.tasks import Task

logger = logging.getLogger(__name__)

AUTO_SMALLEST = 16  # the smallest length bucket of `seq_lens: auto`
AUTO_MAX_TOKENS = 4096  # `max_tokens: auto`: 8 rows of 512, the default grid's 8 x 256 uncut
UNSET_LIMIT = 1_000_000  # a tokenizer's model_max_length at or above this says nothing (transformers' 1e30)
# Model types whose position ids count from past the padding index (RoBERTa's family).
POSITIONS_PAST_PADDING = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text")


def task_plan(task: "Task", config: HandlerConfig, model_dir: Path, tokenizer=None, model_config=None):
    """The bucket plan a worker of `task` serves this model with (the build estimates with it too)."""
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model_config = model_config or AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    limit = length_limit(task.max_seq_len(model_dir, config), tokenizer, model_config)
    return task.adapt_plan(bucket_plan(config, limit), config, model_config)


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
