"""The embedding handler in process on a tiny random BERT: compile counts, recompile guard, errors."""

import fakes
import numpy as np
import pytest
import torch
from fakes import answered, status

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.engine import buckets, layout
from ts_compiled_handlers.engine.runner import EagerRunner

GRID = {"seq_lens": [8, 16, 32], "batch_sizes": [1, 2, 4]}


def ready_handler(model_dir, **handler_config):
    return fakes.ready_handler("embedding", model_dir, **{"buckets": GRID, **handler_config})


@pytest.mark.parametrize(
    "dynamic, grid, graphs",
    [("all", GRID, 1), ("none", {"seq_lens": [8, 32], "batch_sizes": [1, 2]}, 4)],
)
def test_warmup_compiles_exactly_the_grid_and_live_traffic_compiles_nothing(tiny_bert, dynamic, grid, graphs):
    handler = ready_handler(tiny_bert, compile={"dynamic": dynamic}, buckets=grid)
    engine = handler.engine
    assert engine.model.is_compiled and engine.layout.pack_budget == grid["seq_lens"][-1]  # packed, dummy rows for none
    assert compiled_graph_count() == graphs == buckets.expected_graphs(engine.plan)
    texts = ["the cat sat", "hello world " * 6, "a dog", "fast model serve token " * 3, "on the mat"]
    answers = answered(handler, [{"inputs": text} for text in texts])
    assert compiled_graph_count() == graphs
    assert engine.model.recompiles_after_ready == 0
    eager = engine.on(EagerRunner(engine.model.eager)).run(handler.tokenize(texts).token_ids).rows
    for answer, row in zip(answers, eager, strict=True):
        expected = torch.nn.functional.normalize(row, dim=-1)
        assert torch.allclose(torch.tensor(answer["embedding"]), expected, atol=1e-5)


def test_regional_compile_warms_blocks_with_and_without_padding_and_live_traffic_compiles_nothing(tiny_bert):
    handler = ready_handler(tiny_bert, compile={"regional": True})
    engine = handler.engine
    # One block graph for every shape: packed rows always carry their 4-D mask (length groups
    # without padding reach the blocks without one, a second graph).
    assert compiled_graph_count() == buckets.expected_graphs(engine.plan) == 1
    texts = ["the cat sat", "hello world " * 6, "a dog", "fast model serve token " * 3, "x"]
    answers = answered(handler, [{"inputs": text} for text in texts])
    assert compiled_graph_count() == 1 and engine.model.recompiles_after_ready == 0
    eager = engine.on(EagerRunner(engine.model.eager)).run(handler.tokenize(texts).token_ids).rows
    for answer, row in zip(answers, eager, strict=True):
        assert torch.allclose(torch.tensor(answer["embedding"]), torch.nn.functional.normalize(row, dim=-1), atol=1e-5)


def test_a_shape_outside_the_grid_after_ready_is_counted_and_answered_eagerly(tiny_bert):
    handler = ready_handler(tiny_bert, compile={"dynamic": "none"}, buckets={"seq_lens": [8], "batch_sizes": [2, 4]})
    graphs = compiled_graph_count()
    call = layout.Call(buckets.Group((0, 1, 2), batch_size=3, seq_len=8), ((0,), (1,), (2,)))  # batch 3: no bucket
    ids = layout.BatchIds([[2, 5, 3], [2, 6, 7, 3], [2, 3]])
    inputs = layout.call_inputs(ids, call, ids.placement(call), handler.engine.layout, 0)
    with torch.inference_mode():
        got = handler.engine.model(inputs)
        want = handler.engine.model.eager(**inputs)
    assert handler.engine.model.recompiles_after_ready == 1
    assert compiled_graph_count() == graphs
    assert torch.allclose(got, want)


def test_bad_request_in_a_batch_gets_its_own_4xx(tiny_bert):
    handler = ready_handler(tiny_bert, buckets={**GRID, "overflow": "reject"})
    bodies = [{"inputs": "the cat"}, {"inputs": []}, "a " * 100, {"inputs": ["x"]}]
    answers = answered(handler, bodies, ["application/json", "application/json", "text/plain", "application/json"])
    assert [status(handler.context, i) for i in range(4)] == [200, 400, 413, 200]
    assert answers[1]["code"] == 400 and answers[2]["code"] == 413
    assert len(answers[0]["embedding"]) == 32 and len(answers[3]) == 1


def test_truncate_caps_long_texts_at_the_largest_bucket(tiny_bert):
    handler = ready_handler(tiny_bert)
    assert [len(ids) for ids in handler.tokenize(["a " * 100, "the cat"]).token_ids] == [32, 4]


def test_compile_off_serves_eagerly(tiny_bert):
    graphs = compiled_graph_count()
    handler = ready_handler(tiny_bert, compile={"enable": False})
    assert not handler.engine.model.is_compiled and compiled_graph_count() == graphs
    assert len(answered(handler, [{"inputs": "the dog"}])[0]["embedding"]) == 32


def test_a_compile_failure_falls_back_to_eager_or_fails_per_config(tiny_bert, caplog):
    with caplog.at_level("ERROR"):
        handler = ready_handler(tiny_bert, compile={"backend": "no-such-backend"})
    assert not handler.engine.model.is_compiled
    assert "Serving the model EAGERLY" in caplog.text and "no-such-backend" in caplog.text
    with pytest.raises(Exception, match="no-such-backend"):
        ready_handler(tiny_bert, compile={"backend": "no-such-backend", "on_failure": "fail"})


def test_model_length_limit_caps_the_buckets(tiny_bert):
    handler = ready_handler(tiny_bert, buckets={"seq_lens": [16, 48, 128], "batch_sizes": [1, 2]})
    assert handler.engine.plan.seq_lens == (16, 48, 64)  # sentence_bert_config.json says 64


@pytest.mark.parametrize("params", [{}, {"normalize": False}, {"dimensions": 5}, {"dimensions": 5, "normalize": False}])
def test_an_answer_is_normalized_after_its_dimensions_as_torch_normalizes(params):
    """The answer is made in numpy: the same values as torch.nn.functional.normalize's, a zero
    vector included (its norm floored, as torch floors it)."""
    from types import SimpleNamespace

    from ts_compiled_handlers.configuration.config import parse
    from ts_compiled_handlers.protocols.plain import PlainProtocol
    from ts_compiled_handlers.tasks.embedding import EmbeddingTask

    task = EmbeddingTask(parse({"handler": {"task": "embedding"}}))
    task.normalize_default = True
    rows = [*torch.randn(3, 16, generator=torch.Generator().manual_seed(0)), torch.zeros(16)]
    answers = task.answer(SimpleNamespace(request=SimpleNamespace(params=params, protocol=PlainProtocol())), rows)
    expected = torch.stack(rows)[:, : params.get("dimensions", 16)]
    if params.get("normalize", True):
        expected = torch.nn.functional.normalize(expected, dim=-1)
    made = torch.from_numpy(np.array([answer.embedding for answer in answers]))
    assert made.dtype == torch.float32 and made.shape == expected.shape
    assert torch.allclose(made, expected, rtol=1e-6, atol=1e-7)
    assert torch.equal(made[-1], torch.zeros_like(made[-1]))


def test_a_request_batch_re_enters_at_most_3_modules_as_docs_design_md_counts_them(tiny_bert):
    """docs/design.md's request path through TorchServe's request batches, traced: the modules it
    re-enters (a package function called after the path left its module), as many as the docs say."""
    import re
    from pathlib import Path

    from request_path import trace

    handler = ready_handler(tiny_bert, compile={"enable": False})
    bodies = [b'{"inputs": ["a b", "c"]}', b'{"inputs": ["d e f"]}']  # one request's path, twice

    def one_batch():
        return answered(handler, bodies)

    first = one_batch()  # every lazy first time (imports, caches) out of the way
    answers, path = trace(one_batch)
    assert answers == first
    design = (Path(__file__).parents[2] / "docs" / "design.md").read_text()
    documented = int(re.search(r"\*\*Re-entries: (\d+)\.\*\* ", design[design.index("### How one request flows") :])[1])
    assert len(path.reentries) == documented <= 3, path.reentries
    reentered = {module for module, _ in path.reentries}
    assert reentered == {"tasks/embedding.py", "protocols/plain.py", "request/answer_budget.py"}
