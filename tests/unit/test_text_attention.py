"""The per-text attention operator (hfserve::text_attention) against its reference, at random
lengths, paddings, dtypes, causal and grouped heads; inside a compiled graph; and served."""

import logging
import random

import pytest
import torch
from fakes import ready_handler

from ts_compiled_handlers.compiling.compiling import compiled_graph_count
from ts_compiled_handlers.engine import native_ops, packing, text_attention


@pytest.fixture(autouse=True)
def operator():
    """Built once for the run, in the run's shared ops folder (tests/conftest.py)."""
    if not native_ops.load():
        pytest.skip("the C++ compiler could not build the operator")


def random_rows(rows: int, tokens: int, rng: random.Random, longest: int) -> torch.Tensor:
    """Segment ids as the packer lays them out: texts end to end from 1, the tail padding 0."""
    segments = torch.zeros(rows, tokens, dtype=torch.long)
    for row in range(rows):
        start, text = 0, 1
        while start < tokens and rng.random() > 0.1:
            length = min(rng.randint(1, longest), tokens - start)
            segments[row, start : start + length] = text
            start, text = start + length, text + 1
    return segments


def head_major(rows, tokens, heads, dim, dtype) -> torch.Tensor:
    """(rows, heads, T, D) viewed from (rows, T, heads, D), the strides transformers' attention gets."""
    return torch.randn(rows, tokens, heads, dim).to(dtype).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 4, 32), (6, 2, 64), (2, 1, 24)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_operator_equals_the_reference_at_random_lengths(dtype, heads, kv_heads, dim, causal):
    rng = random.Random(f"{dtype}{heads}{dim}{causal}")
    torch.manual_seed(rng.randint(0, 1 << 30))
    segments = random_rows(5, 160, rng, longest=90)
    query = head_major(5, 160, heads, dim, dtype)
    key, value = head_major(5, 160, kv_heads, dim, dtype), head_major(5, 160, kv_heads, dim, dtype)
    expected = text_attention.reference(query, key, value, segments, dim**-0.5, causal)
    # dense_from 48: texts over 48 tokens take the SDPA-per-slice path, the rest the kernel
    for dense_from in (48, 1024):
        out = torch.ops.hfserve.text_attention(query, key, value, segments, dim**-0.5, causal, dense_from)
        assert out.shape == (5, 160, heads, dim) and out.dtype == dtype
        real = segments > 0
        tolerance = 2e-5 if dtype == torch.float32 else 2e-2  # bfloat16: its probabilities are rounded, as SDPA's
        torch.testing.assert_close(out[real].float(), expected[real].float(), atol=tolerance, rtol=tolerance)
        assert torch.count_nonzero(out[~real]) == 0  # padding attends to nothing


def test_over_a_packed_row_it_answers_as_sdpa_under_the_block_mask():
    rng = random.Random(7)
    segments = random_rows(4, 128, rng, longest=50)
    query, key, value = (head_major(4, 128, 4, 32, torch.float32) for _ in range(3))
    mask = packing.block_mask(segments, torch.float32)
    masked = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)
    out = torch.ops.hfserve.text_attention(query, key, value, segments, 32**-0.5, False, text_attention.DENSE_FROM)
    real = segments > 0
    torch.testing.assert_close(out[real], masked[real], atol=2e-5, rtol=2e-5)


def test_in_a_compiled_graph_it_is_one_graph_over_every_shape():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # compiled_graph_count() counts from here
    projection = torch.nn.Linear(4 * 32, 8)

    def layer(query, key, value, segments):
        attended = torch.ops.hfserve.text_attention(query, key, value, segments, 32**-0.5, False, 384)
        return projection(attended.flatten(2))

    compiled = torch.compile(layer, dynamic=True)
    rng = random.Random(3)
    for rows, tokens in ((2, 16), (2, 64), (3, 40), (4, 128)):  # 1 would specialize, as any size 1 does
        segments = random_rows(rows, tokens, rng, longest=30)
        inputs = [head_major(rows, tokens, 4, 32, torch.float32) for _ in range(3)]
        with torch.no_grad():
            torch.testing.assert_close(compiled(*inputs, segments), layer(*inputs, segments), atol=1e-5, rtol=1e-5)
    assert compiled_graph_count() == 1


def test_a_packed_archive_attends_per_text_and_answers_as_under_the_mask(tiny_models, caplog):
    caplog.set_level(logging.INFO, logger="ts_compiled_handlers")
    texts = [list(range(5, 5 + length)) for length in (3, 17, 9, 30, 1, 12)]
    served = {}
    for attention in ("auto", "mask"):
        handler = ready_handler("embedding", tiny_models["embedding"], buckets={"pack_attention": attention})
        assert handler.engine.layout.packed
        served[attention] = torch.stack(handler.engine.run(texts).rows)
        assert ("Packed rows attend per text" in caplog.text) == (attention == "auto")
        caplog.clear()
    torch.testing.assert_close(served["auto"], served["mask"], atol=1e-5, rtol=1e-4)


def test_a_model_without_the_operator_keeps_the_mask(tiny_models, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="ts_compiled_handlers")
    monkeypatch.setattr(native_ops, "load", lambda: False)
    handler = ready_handler("embedding", tiny_models["embedding"])
    assert handler.engine.layout.packed and "Packed rows attend per text" not in caplog.text


VARIANT = """
import random, sys, torch
from ts_compiled_handlers.engine import native_ops, text_attention
from test_text_attention import head_major, random_rows
native_ops.FLAGS = tuple(f for f in native_ops.FLAGS if f != "-march=native") + tuple(sys.argv[1].split())
native_ops._cpu_flags = lambda: set(sys.argv[2].split())
assert native_ops.load()
rng, worst = random.Random(5), 0.0
for dtype in (torch.float32, torch.bfloat16):
    for heads, kv_heads, dim in ((4, 4, 32), (6, 2, 64), (2, 1, 24)):
        for causal in (False, True):
            segments = random_rows(3, 128, rng, longest=70)
            query = head_major(3, 128, heads, dim, dtype)
            key, value = head_major(3, 128, kv_heads, dim, dtype), head_major(3, 128, kv_heads, dim, dtype)
            out = torch.ops.hfserve.text_attention(query, key, value, segments, dim**-0.5, causal, 1024)
            expected = text_attention.reference(query, key, value, segments, dim**-0.5, causal)
            error = (out.float() - expected.float())[segments > 0].abs().max().item()
            worst = max(worst, error / (2e-5 if dtype == torch.float32 else 2e-2))
print(worst)
"""


def cpu_has(*features: str) -> bool:
    return set(features) <= native_ops._cpu_flags()


@pytest.mark.parametrize(
    ("march", "features"),
    [
        pytest.param("-march=haswell", "avx2 fma", id="avx2"),  # CI's AVX2-only machines: the float kernel
        pytest.param(  # AVX512-BF16 without AMX (AMD EPYC): the pair kernel at every head dim
            "-march=sapphirerapids -mno-amx-tile -mno-amx-bf16 -mno-amx-int8",
            "avx512f avx512bw avx512vl avx512dq fma avx512_bf16",
            id="avx512-bf16",
            marks=pytest.mark.skipif(not cpu_has("avx512_bf16"), reason="this CPU cannot run AVX512-BF16 code"),
        ),
    ],
)
def test_the_builds_for_other_cpus_equal_the_reference(march, features, tmp_path):
    """This host's build takes one path per dtype and head dim; the others are built and run here."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": f"{tests}:{tests.parent}", native_ops.OPS_DIR_ENV: str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", VARIANT, march, features], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) <= 1.0  # within each dtype's tolerance of the reference


def test_the_layer_benchmark_checks_and_times_both_sides(tmp_path):
    from ts_compiled_handlers.benchmarks import benchmark_text_attention

    result = benchmark_text_attention.main(["--quick", "--out", str(tmp_path / "attention.json")])
    assert {(row["model"], row["dtype"]) for row in result["results"]} == {
        (model, dtype) for model in ("minilm", "bert-base") for dtype in ("float32", "bfloat16")
    }
    assert all(row["per_text_seconds"] > 0 and row["masked_seconds"] > 0 for row in result["results"])


def test_where_it_cannot_be_built_loading_says_why_and_returns_false(tmp_path):
    """No compiler (a slim image): the worker keeps the block mask, logged, and does not fail."""
    import os
    import subprocess
    import sys

    script = (
        "import logging, sys; logging.basicConfig(level=logging.INFO)\n"
        "from ts_compiled_handlers.engine import native_ops\n"
        "print(native_ops.load())\n"
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-compiler"), native_ops.OPS_DIR_ENV: str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split()[-1] == "False"
    assert "Attention operators unavailable: packed rows keep SDPA with the block mask" in done.stderr
    assert "no-compiler" in done.stderr


def test_only_a_model_attending_through_sdpa_is_switched_and_disable_restores_it(tiny_models):
    from transformers import AutoModel

    eager = AutoModel.from_pretrained(tiny_models["embedding"], attn_implementation="eager")
    assert not text_attention.enable(eager) and eager.config._attn_implementation == "eager"
    model = AutoModel.from_pretrained(tiny_models["embedding"])
    assert text_attention.enable(model) and text_attention.is_enabled(model)
    text_attention.disable(model)
    assert model.config._attn_implementation == "sdpa" and not text_attention.is_enabled(model)
