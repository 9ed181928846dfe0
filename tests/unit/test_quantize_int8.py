"""`quantize: int8` (experimental, issue 57) in process on the tiny random BERT: served int8 and compiled over
the grid with no recompile, or refused by the gate as `compile.on_failure` says."""

import dataclasses
import shutil
from pathlib import Path

import fakes
import pytest
import torch
from fakes import answered

from ts_compiled_handlers.servers.torchserve.embedding_handler import EmbeddingHandler
from ts_compiled_handlers.startup import quantizing
from ts_compiled_handlers.startup.compiling import compiled_graph_count

GRID = {"seq_lens": [8, 32], "batch_sizes": [1, 4]}


def quantized_linears(module: torch.nn.Module) -> int:
    """Dequantize-per-channel nodes left in the converted graph: one per int8 weight."""
    return sum("dequantize_per_channel" in str(node.target) for node in module.graph.nodes)


def test_an_int8_engine_passes_its_gate_and_serves_compiled_without_recompiles(tiny_bert):
    # a loose gate: this test is about the serving path (the gate has its own test below)
    handler = fakes.ready_handler(EmbeddingHandler, tiny_bert, buckets=GRID, quantize="int8", warmup={"tolerance": 0.5})
    engine = handler.engine
    assert isinstance(engine.model.eager, torch.fx.GraphModule) and quantized_linears(engine.model.eager) > 0
    assert engine.model.is_compiled
    graphs = compiled_graph_count()
    answers = answered(handler, [{"inputs": text} for text in ["the cat sat", "hello world " * 6, "a dog"]])
    assert all(len(answer["embedding"]) == 32 for answer in answers)
    assert compiled_graph_count() == graphs and engine.model.recompiles_after_ready == 0
    with pytest.raises(quantizing.QuantizationRefused, match="runs on the CPU, not cuda"):
        quantizing.int8_engine(dataclasses.replace(engine, device=torch.device("cuda")), [], [], "all", 0.5)


@pytest.fixture(scope="module")
def drifting_bert(tiny_bert, tmp_path_factory) -> Path:
    """The tiny BERT made to lose its answers in int8: its quantized linears 20x stronger (so the
    layers shape the embedding), each with one weight column of 1000 on a hidden channel the layer
    norms zero. float32 never reads that column; per-channel int8 scales each row by it, and the
    row's other weights round to 0."""
    from transformers import AutoModel

    folder = tmp_path_factory.mktemp("drifting") / "model"
    shutil.copytree(tiny_bert, folder)
    model = AutoModel.from_pretrained(folder)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight[0] = module.bias[0] = 0
            elif isinstance(module, torch.nn.Linear) and not any(part in name for part in quantizing.KEPT_FLOAT):
                module.weight.mul_(20)
                module.weight[:, 0] = 1000
    model.save_pretrained(folder)
    return folder


def test_the_gate_refuses_a_drifting_int8_model_and_serves_float32_or_fails_as_configured(drifting_bert):
    handler = fakes.ready_handler(EmbeddingHandler, drifting_bert, buckets=GRID, quantize="int8")
    assert not isinstance(handler.engine.model.eager, torch.fx.GraphModule)
    with pytest.raises(quantizing.QuantizationRefused, match="least cosine"):
        fakes.ready_handler(
            EmbeddingHandler, drifting_bert, buckets=GRID, quantize="int8", compile={"on_failure": "fail"}
        )
