"""Packing: texts end to end in token-budget rows, each getting the answer it gets alone.

The embedding handler here is compiled (the served path); the others run eagerly, since what packing
changes is the layout of the inputs, not compilation. Parity with the reference libraries on the
packed path is in the task tests, which pack by default.
"""

import dataclasses
import logging

import pytest
import torch
from fakes import RecordingMetrics, answered, ready_handler, status
from parity import assert_same_answers

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.engine import buckets, layout, packing

GRID = {"seq_lens": [16, 32, 64], "batch_sizes": [1, 4], "pack_tokens": 64}
EAGER = {"compile": {"enable": False}, "warmup": {"iterations": 1}}
TASKS = {  # a handler's name: (its task, its tiny model)
    "embedding": ("embedding", "embedding"),
    "token-classification": ("token-classification", "token-classification"),
    "text-classification": ("text-classification", "text-classification"),
    "text-classification-xlmr": ("text-classification", "text-classification-xlmr"),
}


@pytest.fixture(scope="module")
def handlers(tiny_models):
    made = {"embedding": ready_handler("embedding", tiny_models["embedding"], buckets=GRID)}
    made["embedding graphs"] = compiled_graph_count()
    for name, (task, model) in TASKS.items():
        made.setdefault(name, ready_handler(task, tiny_models[model], buckets=GRID, **EAGER))
    return made


def texts_of(handler, lengths: list[int]) -> list[list[int]]:
    return [handler.serving.probes.filler(length, 1)[0] for length in lengths]


def calls_of(handler, token_ids: list[list[int]]) -> list[layout.Call]:
    engine = handler.engine
    return engine.layout.calls([len(ids) for ids in token_ids], engine.plan)


def padded_tokens(handler, token_ids: list[list[int]]) -> int:
    return buckets.padded_tokens([call.group for call in calls_of(handler, token_ids)])


def rows(handler, token_ids: list[list[int]]) -> list[torch.Tensor]:
    return handler.engine.run(token_ids).rows


def test_rows_fill_up_to_the_budget_longest_first_and_a_longer_text_rides_alone():
    assert packing.pack_rows([10, 30, 24, 40, 6, 70], 64, (16, 32, 64, 128)) == [[5], [3, 2], [1, 0, 4]]
    # a row holds no more texts than its bucket has slots (a 16-token row: 4), however short they are
    assert packing.pack_rows([2] * 6, 64, (16, 32, 64)) == [[0, 1, 2, 3], [4, 5]]


def test_a_length_group_masks_its_padding_and_its_dummy_rows_attend_one_token():
    call = layout.Call(buckets.Group((0, 1), batch_size=4, seq_len=8), ((0,), (1,)))  # 2 dummy rows: static batch
    ids = layout.BatchIds([[5, 6, 7], [5, 6]])
    inputs = layout.call_inputs(ids, call, ids.placement(call), layout.Layout(), pad_id=0)
    assert set(inputs) == {"input_ids", "attention_mask"}
    assert inputs["input_ids"].tolist() == [[5, 6, 7, 0, 0, 0, 0, 0], [5, 6, 0, 0, 0, 0, 0, 0]] + [[0] * 8] * 2
    assert inputs["attention_mask"].sum(dim=1).tolist() == [3, 2, 1, 1]


def test_each_text_gets_positions_from_the_first_and_a_segment_of_its_own():
    call = layout.Call(buckets.Group((0,), 1, 8), ((0, 1),))
    ids = layout.BatchIds([[9, 5, 9], [9, 7, 8, 9]])
    place = ids.placement(call)
    inputs = layout.call_inputs(ids, call, place, layout.Layout(8, first_position=2), pad_id=1)
    assert inputs["input_ids"].tolist() == [[9, 5, 9, 9, 7, 8, 9, 1]]
    assert inputs["position_ids"].tolist() == [[2, 3, 4, 2, 3, 4, 5, 2]]
    assert inputs["segments"].tolist() == [[1, 1, 1, 2, 2, 2, 2, 0]]
    assert (place.texts, place.row_of.tolist(), place.segment.tolist()) == ([0, 1], [0, 0], [1, 2])


def test_each_packed_text_is_pooled_in_its_own_slot():
    segments = torch.tensor([[1, 1, 2, 2, 2, 0, 0, 0]])  # two texts, then padding: 2 slots of 8 tokens
    hidden = torch.arange(8, dtype=torch.float32).view(1, 8, 1)
    pooled = packing.pool_per_text(hidden, segments, ("cls", "lasttoken", "max", "mean"))
    assert pooled.tolist() == [[[0.0, 1.0, 1.0, 0.5], [2.0, 4.0, 4.0, 3.0]]]


def test_the_mask_lets_a_token_see_its_own_segment_only():
    visible = packing.block_mask(torch.tensor([[1, 1, 2, 0]]), torch.float32)[0, 0] == 0
    assert visible.int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]


@pytest.mark.parametrize("task", TASKS)
def test_a_text_alone_equals_the_same_text_inside_a_pack_it_fills_exactly(handlers, task):
    handler = handlers[task]
    assert handler.engine.layout.pack_budget == 64
    token_ids = texts_of(handler, [30, 20, 14])
    assert padded_tokens(handler, token_ids) == 64  # one row of 64 tokens, no padding at all
    together = rows(handler, token_ids)
    for ids, row in zip(token_ids, together, strict=True):
        alone = rows(handler, [ids])[0]
        assert row.shape == alone.shape
        torch.testing.assert_close(row, alone, atol=1e-5, rtol=0)


def test_a_text_longer_than_the_budget_gets_a_row_of_its_own(tiny_models):
    handler = ready_handler("embedding", tiny_models["embedding"], buckets={**GRID, "pack_tokens": 32}, **EAGER)
    token_ids = texts_of(handler, [50, 10, 12])
    calls = calls_of(handler, token_ids)
    assert [(call.group.batch_size, call.group.seq_len) for call in calls] == [(1, 32), (1, 64)]
    assert [call.texts for call in calls] == [[2, 1], [0]]
    for ids, row in zip(token_ids, rows(handler, token_ids), strict=True):
        torch.testing.assert_close(row, rows(handler, [ids])[0], atol=1e-5, rtol=0)


def test_positions_of_an_xlmr_model_start_past_its_padding_index(handlers):
    handler = handlers["text-classification-xlmr"]
    assert handler.engine.layout.first_position == 2  # pad id 1
    token_ids = texts_of(handler, [30, 20, 14])
    alone = [rows(handler, [ids])[0] for ids in token_ids]
    zero_based = dataclasses.replace(handler.engine.layout, first_position=0)  # what the check would catch
    wrong = dataclasses.replace(handler.engine, layout=zero_based).run(token_ids).rows
    assert max((got - want).abs().max().item() for got, want in zip(wrong, alone, strict=True)) > 1e-3


def test_a_model_that_fails_the_packed_check_keeps_length_groups(tiny_models, monkeypatch, caplog):
    monkeypatch.setattr(packing, "first_position", lambda module: 0)  # XLM-R's positions, counted wrongly
    with caplog.at_level(logging.WARNING, logger="ts_compiled_handlers.startup.build_steps"):
        handler = ready_handler("text-classification", tiny_models["text-classification-xlmr"], buckets=GRID, **EAGER)
    assert not handler.engine.layout.packed and "Packing OFF" in caplog.text
    assert padded_tokens(handler, texts_of(handler, [30, 20, 14])) == 32 + 32 + 16  # a group per bucket


def test_a_head_packing_cannot_reach_keeps_length_groups(tiny_models, caplog):
    with caplog.at_level(logging.WARNING, logger="ts_compiled_handlers.startup.build_steps"):
        handler = ready_handler(
            "text-classification", tiny_models["text-classification-distilbert"], buckets=GRID, **EAGER
        )
    assert not handler.engine.layout.packed and "neither BERT- nor RoBERTa-like" in caplog.text


def test_static_batches_pad_packed_rows_with_dummy_rows(tiny_models):
    static = {"enable": False, "dynamic": "none"}
    handler = ready_handler("embedding", tiny_models["embedding"], buckets=GRID, compile=static)
    token_ids = texts_of(handler, [50, 40, 30])  # three rows: 50, 40 and 30 tokens
    calls = calls_of(handler, token_ids)
    assert [(call.group.batch_size, call.group.seq_len) for call in calls] == [(1, 32), (4, 64)]
    for ids, row in zip(token_ids, rows(handler, token_ids), strict=True):
        torch.testing.assert_close(row, rows(handler, [ids])[0], atol=1e-5, rtol=0)


def test_a_bad_request_in_a_packed_batch_gets_its_own_400_and_padding_is_counted(handlers):
    handler = handlers["embedding"]
    context = handler.context
    context.metrics = RecordingMetrics()
    real, computed = handler.lengths.real_tokens, handler.lengths.padded_tokens
    bodies = [{"inputs": "the cat sat"}, {"inputs": 5}, {"inputs": ["hello world", "alice walks to paris"]}]
    answers = answered(handler, bodies)
    assert [status(context, index) for index in range(3)] == [200, 400, 200]
    assert "error" in answers[1]
    texts = ["the cat sat", "hello world", "alice walks to paris"]
    lengths = [len(ids) for ids in handler.tokenize(texts).token_ids]
    assert handler.lengths.real_tokens - real == sum(lengths) == 15
    assert handler.lengths.padded_tokens - computed == 16  # the three texts share one 16-token row
    ratios = [value for name, value, _, _ in context.metrics.calls if name == "PaddedTokenRatio"]
    assert ratios == [round(handler.lengths.padded_ratio, 3)]
    shapes = [(dims["Bucket"], value) for name, value, dims, _ in context.metrics.calls if name == "BucketRequests"]
    assert shapes == [("packed 1x16", 3)]
    for body, answer in ((bodies[0], answers[0]), (bodies[2], answers[2])):
        assert_same_answers(answered(handler, [body])[0], answer, tolerance=1e-5)


def test_packed_traffic_compiles_nothing_after_ready(handlers):
    handler = handlers["embedding"]
    assert handlers["embedding graphs"] == handler.worker.task.graphs_needed(handler.engine.plan) == 1
    graphs = compiled_graph_count()
    for lengths in ([5, 9, 60, 3], [64], [16, 16, 16, 16, 33, 2], [40] * 9, [2] * 40):
        rows(handler, texts_of(handler, lengths))
    assert compiled_graph_count() == graphs and handler.engine.model.recompiles_after_ready == 0


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_a_start_runs_the_model_eagerly_once_per_check_it_needs_on_the_probe(tiny_models, monkeypatch, dtype):
    """A long-context model's probe holds texts at its limit: a check that needs an eager answer
    another check computed takes it (the packed rows' for compiled vs eager, the length groups'
    at the served dtype for `dtype: auto` and packing), not a pass of its own."""
    from ts_compiled_handlers.engine.engine import Engine
    from ts_compiled_handlers.engine.runner import EagerRunner
    from ts_compiled_handlers.runtime import hardware

    passes, run = [], Engine.run

    def counted(engine, token_ids, *args, **kwargs):
        if isinstance(engine.model, EagerRunner) and len(token_ids) > 4:  # the probe: two rows per length
            passes.append((engine.layout.packed, engine.dtype))
        return run(engine, token_ids, *args, **kwargs)

    monkeypatch.setattr(Engine, "run", counted)
    monkeypatch.setattr(hardware.Hardware, "auto_dtype", torch.bfloat16)  # `auto` checks bfloat16 on any CPU
    handler = ready_handler("embedding", tiny_models["embedding"], buckets=GRID, dtype=dtype)
    assert handler.engine.model.is_compiled and handler.engine.layout.packed
    assert len(passes) == len(set(passes))  # no layout at a dtype run twice
    expected = {(False, torch.float32), (True, torch.float32)}
    if dtype == "auto":  # float32's answers, then bfloat16's, reused by the packing check
        expected = {(False, torch.float32), (False, torch.bfloat16), (True, torch.bfloat16)}
    assert set(passes) == expected


def test_a_sliding_layers_mask_keeps_each_text_within_its_window():
    segments = torch.tensor([[1, 1, 1, 1, 1, 2, 2, 0]])  # texts of 5 and 2 tokens, one padding

    def seen(**kwargs) -> int:  # the pairs the mask lets through
        return int((packing.block_mask(segments, torch.float32, **kwargs) == 0).sum())

    assert seen() == 25 + 4 + 1
    assert seen(window=2) == (5 + 2 * 4) + (2 + 2) + 1  # each token, and its neighbours within its text
    assert seen(window=2, causal=True) == (5 + 4) + (2 + 1) + 1


@pytest.mark.parametrize("family", ["embedding-gemma", "embedding-modernbert", "embedding"])
def test_the_sliding_window_is_each_models_own_bound(tiny_models, family):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_models[family])
    expected = {  # keys fewer positions away than this: Gemma 3's window, ModernBERT's half window + 1
        "embedding-gemma": lambda config: config.sliding_window,
        "embedding-modernbert": lambda config: config.local_attention // 2 + 1,
        "embedding": lambda config: 0,  # BERT: no sliding layers, one mask
    }[family](model.config)
    assert packing.sliding_window(model) == expected
