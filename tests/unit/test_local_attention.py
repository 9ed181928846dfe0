"""Sliding-window attention at its window's cost (hfserve::local_attention): against SDPA under the
whole banded mask and the plain-torch reference at random lengths, windows, paddings, dtypes and
grouped heads; against a ModernBERT's own eager attention; one graph when compiled."""

import random

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from ts_compiled_handlers.engine import local_attention, native_ops, text_attention


@pytest.fixture(autouse=True)
def operator():
    """Built once for the run, in the run's shared ops folder (tests/conftest.py)."""
    if not native_ops.load():
        pytest.skip("the C++ compiler could not build the operator")


def banded_mask(lengths: list[int], tokens: int, window: int, causal: bool = False) -> torch.Tensor:
    """(rows, 1, T, T) booleans as transformers' sliding masks: |q - k| <= window (k <= q where
    causal), keys past each row's length padding."""
    position = torch.arange(tokens)
    near = (position[:, None] - position[None, :]).abs() <= window
    if causal:
        near &= position[None, :] <= position[:, None]
    real = torch.stack([position < length for length in lengths])
    return (near[None] & real[:, None, :]).unsqueeze(1)


def head_major(rows, tokens, heads, dim, dtype) -> torch.Tensor:
    """(rows, heads, T, D) viewed from (rows, T, heads, D), the strides transformers' attention gets."""
    return torch.randn(rows, tokens, heads, dim).to(dtype).transpose(1, 2)


def full(query, key, value, mask, scale) -> torch.Tensor:
    """SDPA under the whole mask, as transformers' sdpa attention computes a sliding layer."""
    grouped = key.shape[1] != query.shape[1]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale, enable_gqa=grouped)
    return out.transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 4, 32), (6, 2, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_operator_equals_sdpa_under_the_banded_mask_at_random_lengths(dtype, heads, kv_heads, dim, causal):
    rng = random.Random(f"{dtype}{heads}{dim}{causal}")
    torch.manual_seed(rng.randint(0, 1 << 30))
    tolerance = 2e-5 if dtype == torch.float32 else 2e-2
    for tokens in (rng.randint(2, 60), 64, rng.randint(65, 200), rng.randint(300, 700)):
        window = rng.choice((3, 17, 64, 129))
        lengths = [tokens, rng.randint(1, tokens)]
        mask = banded_mask(lengths, tokens, window, causal)
        query = head_major(2, tokens, heads, dim, dtype)
        key, value = head_major(2, tokens, kv_heads, dim, dtype), head_major(2, tokens, kv_heads, dim, dtype)
        expected = full(query, key, value, mask, dim**-0.5)
        for given in (mask, torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)):
            out = torch.ops.hfserve.local_attention(query, key, value, given, window, dim**-0.5)
            assert out.shape == (2, tokens, heads, dim) and out.dtype == dtype and out.is_contiguous()
            reference = local_attention.banded(query, key, value, given, window, dim**-0.5)
            for row, length in enumerate(lengths):  # the real tokens; padding queries answer nothing useful
                torch.testing.assert_close(out[row, :length], expected[row, :length], atol=tolerance, rtol=tolerance)
                close = {"atol": tolerance, "rtol": tolerance}
                torch.testing.assert_close(reference[row, :length], expected[row, :length], **close)


def test_without_a_mask_every_pair_attends():
    """transformers gives a sliding layer no mask only where its window reaches every key."""
    for tokens, window in ((40, 40), (200, 300)):
        query = head_major(1, tokens, 2, 16, torch.float32)
        out = torch.ops.hfserve.local_attention(query, query, query, None, window, 0.25)
        expected = F.scaled_dot_product_attention(query, query, query, scale=0.25).transpose(1, 2)
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_in_a_compiled_graph_it_is_one_graph_over_every_length():
    counters.clear()
    torch._dynamo.reset()

    def layer(query, mask):
        return torch.ops.hfserve.local_attention(query, query, query, mask, 24, 0.25) * 2

    compiled = torch.compile(layer)
    for tokens in (16, 64, 100, 333, 512):
        query = head_major(2, tokens, 2, 16, torch.float32)
        mask = banded_mask([tokens, tokens // 2 + 1], tokens, 24)
        torch._dynamo.mark_dynamic(query, 2)
        torch._dynamo.mark_dynamic(mask, 2)
        torch._dynamo.mark_dynamic(mask, 3)
        expected = full(query, query, query, mask, 0.25) * 2
        torch.testing.assert_close(compiled(query, mask)[0], expected[0], atol=2e-5, rtol=2e-5)
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_modernbert_answers_as_with_its_own_eager_attention(tiny_models, dtype):
    """Its local layers (a 16-token window in the tiny model) at random lengths over many windows."""
    from transformers import AutoModel

    folder = tiny_models["embedding-modernbert"]
    own = AutoModel.from_pretrained(folder, attn_implementation="eager").eval().to(dtype)
    banded = AutoModel.from_pretrained(folder).eval().to(dtype)
    assert local_attention.enable(banded) and banded.config._attn_implementation == local_attention.ATTENTION
    rng = random.Random(3)
    for tokens in (rng.randint(3, 20), rng.randint(40, 127)):
        ids = torch.randint(5, own.config.vocab_size, (2, tokens))
        mask = torch.ones(2, tokens, dtype=torch.long)
        mask[1, rng.randint(1, tokens - 1) :] = 0
        with torch.inference_mode():
            expected = own(input_ids=ids, attention_mask=mask).last_hidden_state
            got = banded(input_ids=ids, attention_mask=mask).last_hidden_state
        real = mask.bool()
        cosine = F.cosine_similarity(got[real].float(), expected[real].float(), dim=-1)
        assert cosine.min() > (0.99999 if dtype == torch.float32 else 0.999)


def test_only_a_model_with_sliding_layers_on_sdpa_is_switched(tiny_models):
    from transformers import AutoConfig, AutoModel

    plain = AutoModel.from_pretrained(tiny_models["embedding"])
    assert not local_attention.enable(plain) and plain.config._attn_implementation == "sdpa"
    eager = AutoModel.from_pretrained(tiny_models["embedding-modernbert"], attn_implementation="eager")
    assert not local_attention.enable(eager) and eager.config._attn_implementation == "eager"
    assert local_attention.configured(AutoConfig.from_pretrained(tiny_models["embedding-modernbert"]))
    assert not local_attention.configured(AutoConfig.from_pretrained(tiny_models["embedding"]))
    # per-text attention over packed rows, then back: the sliding layers keep their band
    model = AutoModel.from_pretrained(tiny_models["embedding-modernbert"])
    assert text_attention.enable(model)
    text_attention.disable(model)
    assert model.config._attn_implementation == local_attention.ATTENTION
