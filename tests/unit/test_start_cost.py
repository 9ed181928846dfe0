"""A start's plan from the model's FLOPs: what each pass costs, counted from the configuration and
the weights' headers, and logged by a worker before it starts."""

import logging

import torch
from fakes import ready_handler
from transformers import AutoConfig, AutoModel

from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.startup import start_cost

MODERNBERT = {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 3, "local_attention": 16}


def test_the_linear_weights_are_the_model_s_matrices_without_its_embedding_tables(tiny_models):
    folder = tiny_models["embedding"]
    model = AutoModel.from_pretrained(folder)
    matrices = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name)
    assert start_cost.linear_weights(folder) == matrices > 0


def test_a_sliding_layer_s_attention_is_counted_at_its_window():
    config = AutoConfig.for_model("modernbert", **MODERNBERT)  # layers: full, sliding, sliding
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    length, window = 1000, config.sliding_window
    attention = 4 * length * 32 * (length + 2 * (2 * window + 1))
    assert start_cost.text_flop(config, 5000, length) == 2 * 5000 * length + attention
    short = 10  # shorter than the window: every key on every layer
    assert start_cost.text_flop(config, 5000, short) == 2 * 5000 * short + 4 * short * 32 * 3 * short


def test_the_plan_counts_the_grid_s_passes_and_each_eager_check():
    config = AutoConfig.for_model("bert", hidden_size=32, num_attention_heads=2, num_hidden_layers=2)
    plan = buckets.BucketPlan((16, 32), (1, 2), "all")
    passes = {"grid": 2, torch.bfloat16: 2, torch.float32: 1}
    planned = start_cost.plan_start(config, 1000, plan, [16, 9, 32, 17], passes)
    one = lambda length: start_cost.text_flop(config, 1000, length)  # noqa: E731
    grid = 3 * one(16) + 3 * one(32)  # batches 1 and 2 at each length
    probe = 2 * one(16) + 2 * one(32)  # each text padded to its bucket
    assert planned["compiled_flop"] == 2 * grid + probe
    assert planned["eager_flop"] == {torch.bfloat16: 2 * probe, torch.float32: probe}
    assert planned["calls"] == 4 * 2 + 4 * (1 + 3)
    rates = {torch.bfloat16: 2e9, torch.float32: 1e9}
    seconds = start_cost.StartPlan(10.0, **planned, rates=rates, served=torch.bfloat16).seconds
    expected = 10.0 + (2 * grid + probe) / 2e9 + 2 * probe / 2e9 + probe / 1e9 + planned["calls"] * 0.002
    assert abs(seconds - expected) < 1e-9


def test_a_worker_logs_its_plan_then_how_long_it_took(tiny_models, caplog):
    caplog.set_level(logging.INFO, logger="ts_compiled_handlers")
    ready_handler("embedding", tiny_models["embedding"])
    assert "Start planned: about" in caplog.text and "Started in" in caplog.text and ", planned " in caplog.text
