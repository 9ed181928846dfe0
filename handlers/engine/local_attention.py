"""Sliding-window attention at the cost of its window: ModernBERT's local layers, Gemma 3's sliding ones.

transformers runs a sliding-window layer as full attention under a banded mask: a text of T tokens
scores T x T pairs and the mask discards all but about T x window of them (at 8192 tokens and
ModernBERT's 128-token window, 97% of the work). The `hfserve::local_attention` operator
(local_attention.cpp, built with the others: native_ops.py) cuts the queries into blocks of `BLOCK`
and scores each block against only the keys within the layer's `sliding_window` of it, under the
same mask's entries for those pairs. So it computes what the masked call computes wherever the mask
allows nothing farther (every sliding mask transformers makes: |q - k| below or at the
`sliding_window` each layer passes to its attention), at the window's cost; a text of one block is
one SDPA call, as before. Inductor calls it as an extern kernel, in the compiled graph and in AOT
packages, with no branch on the length, so a dynamic graph stays one graph. `banded` computes the
same in plain torch, as a reference.

`enable(model)` switches a model with sliding layers that attends through SDPA to `ATTENTION`:
the operator on the sliding layers (on the CPU, where it is built), SDPA on the others.
"""

import functools
import logging

import torch
import torch.nn.functional as F

from ts_compiled_handlers.engine import native_ops

logger = logging.getLogger(__name__)

ATTENTION = "hfserve_local"  # the name under transformers' attention interface
BLOCK = 64  # queries per block, as local_attention.cpp cuts them


def banded(query, key, value, mask, window: int, scale: float) -> torch.Tensor:
    """Attention of (rows, heads, T, D) queries over keys within `window` positions of each, under
    `mask` ((rows, 1 or heads, T, T), boolean or additive; None, which transformers gives only where
    the window reaches every key: every pair), as (rows, T, heads, D): what the operator computes,
    gathered in plain torch (the tests' second reference, beside SDPA under the whole mask)."""
    rows, heads, tokens, dim = query.shape
    if key.shape[1] != heads:  # grouped-query attention: each key head serves heads / kv_heads queries
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    tail = -tokens % BLOCK
    blocks = (tokens + tail) // BLOCK
    # block b's queries are b x BLOCK + (0 .. BLOCK-1); the keys they reach, in the key axis padded
    # by `window` on both sides, b x BLOCK + (0 .. BLOCK + 2 x window - 1)
    starts = torch.arange(blocks, device=query.device)[:, None] * BLOCK
    reached = starts + torch.arange(BLOCK + 2 * window, device=query.device)  # (blocks, reach)
    queried = starts + torch.arange(BLOCK, device=query.device)  # (blocks, BLOCK)
    queries = F.pad(query, (0, 0, 0, tail)).view(rows, heads, blocks, BLOCK, dim)
    keys = F.pad(key, (0, 0, window, window + tail))[:, :, reached]
    values = F.pad(value, (0, 0, window, window + tail))[:, :, reached]
    allowed = _band_of(mask, (rows, tokens, window, tail), queried, reached, query.device)
    out = F.scaled_dot_product_attention(
        _blocks_first(queries), _blocks_first(keys), _blocks_first(values), attn_mask=allowed, scale=scale
    )
    out = out.view(rows, blocks, heads, BLOCK, dim).permute(0, 1, 3, 2, 4).reshape(rows, blocks * BLOCK, heads, dim)
    return out[:, :tokens]


def _band_of(mask, sizes: tuple, queried, reached, device) -> torch.Tensor:
    """The mask's entries for each block's queries and the keys they reach, (rows x blocks, 1 or
    heads, BLOCK, reach) booleans; keys past either end are never allowed."""
    rows, tokens, window, tail = sizes
    if mask is None:
        mask = torch.ones(rows, 1, tokens, tokens, dtype=torch.bool, device=device)
    elif mask.dtype != torch.bool:  # additive: a pair is allowed where nothing is subtracted
        mask = mask > torch.finfo(mask.dtype).min / 2
    padded = F.pad(mask, (window, window + tail, 0, tail), value=False)
    band = padded[:, :, queried[:, :, None], reached[:, None, :]]  # (rows, h, blocks, BLOCK, reach)
    return band.transpose(1, 2).reshape(-1, padded.shape[1], *band.shape[-2:])


def _blocks_first(states: torch.Tensor) -> torch.Tensor:
    """(rows, heads, blocks, n, D) -> (rows x blocks, heads, n, D): one SDPA batch entry per block."""
    rows, heads, blocks, length, dim = states.shape
    return states.transpose(1, 2).reshape(rows * blocks, heads, length, dim)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-interface call: banded on a sliding-window layer, SDPA otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    window = kwargs.get("sliding_window")
    square = query.shape[2] == key.shape[2]  # not a decoding step against a cache
    causal_unmasked = getattr(module, "is_causal", False) and attention_mask is None  # the window reaches all
    if not window or not square or causal_unmasked or query.device.type != "cpu":
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return torch.ops.hfserve.local_attention(query, key, value, attention_mask, window, scale), None


def configured(model_config) -> bool:
    """Whether a model's configuration gives it sliding-window layers: `enable` switches those, and
    an AOT package of such a model calls the operator."""
    layer_types = getattr(model_config.get_text_config(), "layer_types", None) or ()
    return "sliding_attention" in layer_types


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def enable(model: torch.nn.Module) -> bool:
    """Switch `model`'s attention to banded on its sliding layers; False, left as it was, where it
    has none, does not attend through SDPA and transformers' attention interface, is not on the
    CPU or the operator cannot be built. Per-text attention over packed rows (text_attention.py)
    keeps the band on those layers."""
    models = transformers_models(model)
    if not any(configured(part.config) for part in models):
        return False
    if any(part.config._attn_implementation != "sdpa" for part in models):
        return False
    on_cpu = all(parameter.device.type == "cpu" for parameter in model.parameters())
    if not on_cpu or not native_ops.load():  # elsewhere SDPA's own kernels take the banded mask
        return False
    _register()
    for part in models:
        part.set_attn_implementation(ATTENTION)
    logger.info("Sliding-window layers attend within their window only (banded, %d queries a block)", BLOCK)
    return True


def transformers_models(model: torch.nn.Module) -> list:
    """The outermost transformers models in `model` (one switch covers their submodules)."""
    from transformers import PreTrainedModel

    found, inner = [], set()
    for part in model.modules():
        if isinstance(part, PreTrainedModel) and id(part) not in inner:
            found.append(part)
            inner.update(id(sub) for sub in part.modules())
    return found
