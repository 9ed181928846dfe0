"""benchmarks/packed_call_split.py: the ops sorted into the kinds its table adds up, and the share of
a packed call's attention scores that lie inside a text's own block."""

from fakes import ready_handler

from ts_compiled_handlers.benchmarks.packed_call_split import kind, useful_scores
from ts_compiled_handlers.servers.torchserve.embedding_handler import EmbeddingHandler


def test_ops_are_sorted_into_linears_attention_inductor_s_kernels_and_the_rest():
    assert {kind(name) for name in ("mkldnn::_linear_pointwise", "onednn::qlinear_pointwise", "aten::addmm")} == {
        "linears"
    }
    assert kind("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert kind("## Call CompiledFxGraph fabc123 ##") == "inductor kernels"
    assert kind("TorchDynamo Cache Lookup") == "rest"


def test_the_useful_share_is_each_text_s_block_over_every_score_of_its_call(tiny_models):
    grid = {"seq_lens": [16, 32], "batch_sizes": [1, 2], "pack_tokens": 16}
    handler = ready_handler(EmbeddingHandler, tiny_models["embedding"], buckets=grid, compile={"enable": False})
    pair = [[5] * 10, [6] * 6]  # 10 + 6 tokens: one packed row of 16
    assert useful_scores(handler, [pair]) == (10**2 + 6**2) / 16**2
    # a text past the budget gets a row of its own, padded to the 32 bucket: its padding is wasted too
    assert useful_scores(handler, [pair, [[7] * 20]]) == (10**2 + 6**2 + 20**2) / (16**2 + 32**2)
