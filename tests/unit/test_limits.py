"""The model's own length limit and the bucket grid that reaches it."""

import pytest
from transformers import BertConfig, XLMRobertaConfig

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.startup import bucket_plan


class Tokenizer:
    def __init__(self, model_max_length: int):
        self.model_max_length = model_max_length


@pytest.mark.parametrize(
    "own, stated, config, limit",
    [
        (256, 512, BertConfig(max_position_embeddings=512), 256),  # sentence-transformers' max_seq_length wins
        (None, 512, BertConfig(max_position_embeddings=512), 512),  # else the tokenizer's model_max_length
        (None, int(1e30), BertConfig(max_position_embeddings=512), 512),  # an unset one: the position table
        (None, int(1e30), XLMRobertaConfig(max_position_embeddings=514, pad_token_id=1), 512),  # past padding
        (8192, int(1e30), BertConfig(max_position_embeddings=512), 512),  # never past the position table
    ],
)
def test_the_limit_is_the_smallest_the_model_states(own, stated, config, limit):
    assert bucket_plan.length_limit(own, Tokenizer(stated), config) == limit


def test_auto_buckets_double_up_to_the_limit_and_a_list_is_capped_at_it():
    assert bucket_plan.doubling(512) == (16, 32, 64, 128, 256, 512)
    assert bucket_plan.doubling(300) == (16, 32, 64, 128, 256, 300)
    assert bucket_plan.doubling(8) == (8,)
    auto = bucket_plan.bucket_plan(parse({}), 512)
    assert auto.seq_lens == (16, 32, 64, 128, 256, 512) and auto.pack_tokens == 256 and auto.max_tokens == 4096
    listed = bucket_plan.bucket_plan(parse({"handler": {"buckets": {"seq_lens": [16, 64, 1024]}}}), 512)
    assert listed.seq_lens == (16, 64, 512)
    long = bucket_plan.bucket_plan(parse({"handler": {"buckets": {"max_tokens": 16384}}}), 8192)
    assert long.seq_lens[-1] == 8192 and long.rows_for(8192) == 2
