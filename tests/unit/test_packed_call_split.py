"""benchmarks/packed_call_split.py: the ops sorted into the kinds its table adds up, and the share of
a packed call's attention scores that lie inside a text's own block."""

from fakes import ready_handler

from ts_compiled_handlers.benchmarks.packed_call_split import kind, scores_inside_texts


def test_ops_are_sorted_into_linears_attention_compiled_kernels_and_the_rest():
    assert {kind(name) for name in ("mkldnn::_linear_pointwise", "onednn::qlinear_pointwise", "aten::addmm")} == {
        "linears"
    }
    assert kind("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert kind("## Call CompiledFxGraph fabc123 ##") == "inductor kernels"
    assert kind("TorchDynamo Cache Lookup") == "rest"


def test_the_scores_inside_texts_are_each_text_s_block_against_every_score_its_calls_compute(tiny_models):
    grid = {"seq_lens": [16, 32], "batch_sizes": [1, 4], "pack_tokens": 16}

    def scores(batch: list[list[int]], dynamic: str = "all") -> tuple[int, int]:
        compile_options = {"enable": False, "dynamic": dynamic}
        handler = ready_handler("embedding", tiny_models["embedding"], buckets=grid, compile=compile_options)
        return scores_inside_texts(handler.engine.run(batch).calls, [len(ids) for ids in batch])

    assert scores([[5] * 10, [6] * 6]) == (10**2 + 6**2, 16**2)  # 10 + 6 tokens: one packed row of 16
    # past the budget, a text gets a row of its own, padded to the 32 bucket
    assert scores([[7] * 20]) == (20**2, 32**2)
    # two texts of 10 never share a row of 16: three rows, and a dummy fourth where the batch dimension
    # is not dynamic (the batch bucket is 4)
    assert scores([[5] * 10] * 3) == (3 * 10**2, 3 * 16**2)
    assert scores([[5] * 10] * 3, dynamic="none") == (3 * 10**2, 4 * 16**2)
