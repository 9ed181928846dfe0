"""Attention over each packed text alone: the `hfserve::text_attention` operator.

Over packed rows, SDPA scores every token against every token of its row and the block-diagonal
mask discards the pairs that straddle two texts (73% of the scores on the load test's traffic,
docs/performance.md). The operator (text_attention.cpp, built with the C++ compiler inductor
uses: native_ops.py) scores each text against itself only. Inductor calls it as an extern kernel,
in the compiled graph and in AOT packages; `reference` is what it is tested against.

It is reached through transformers' attention interface: `enable(model)` switches a model's
attention to `ATTENTION`, which runs the operator when the call carries the rows' segments
(`text_segments`, PackedModel), banded attention on sliding-window layers (local_attention.py)
and SDPA otherwise (padded calls). Where the operator cannot be built, `enable` says why once in
the log and the model keeps SDPA with the mask.
"""

import functools
import logging

import torch

from ts_compiled_handlers.engine import local_attention, native_ops

logger = logging.getLogger(__name__)

ATTENTION = "hfserve_text"  # the name under transformers' attention interface
SEGMENTS_KWARG = "text_segments"  # the (rows, T) segment ids a packed call passes down to attention
DENSE_FROM = 384  # texts longer than this go to SDPA on their own slice (its kernels' rate pays there)


def reference(query, key, value, segments, scale: float, causal: bool) -> torch.Tensor:
    """What the operator computes, text by text in float32: (rows, T, heads, D), zeros at padding."""
    rows, heads, tokens, dim = query.shape
    out = query.new_zeros(rows, tokens, heads, dim)
    group = heads // key.shape[1]
    for row in range(rows):
        ids = segments[row].tolist()
        start = 0
        while start < tokens:
            end = start + 1
            while end < tokens and ids[end] == ids[start]:
                end += 1
            if ids[start] > 0:
                q = query[row, :, start:end].float()
                k = key[row, :, start:end].float().repeat_interleave(group, dim=0)
                v = value[row, :, start:end].float().repeat_interleave(group, dim=0)
                scores = q @ k.transpose(-1, -2) * scale
                if causal:
                    scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
                out[row, start:end] = (scores.softmax(-1) @ v).transpose(0, 1).to(out.dtype)
            start = end
    return out


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-interface call: per text where the call carries its segments."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    segments = kwargs.get(SEGMENTS_KWARG)
    if kwargs.get("sliding_window"):  # the block mask keeps each text to itself within the band
        return local_attention.attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    if segments is None or query.device.type != "cpu":
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    causal = bool(getattr(module, "is_causal", False))
    out = torch.ops.hfserve.text_attention(query, key, value, segments, scale, causal, DENSE_FROM)
    return out, None


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def enable(model: torch.nn.Module) -> bool:
    """Switch `model`'s attention (each transformers model inside it) to per text over packed rows;
    False, its attention left as it was, where the operator cannot be built or the model does not
    attend through SDPA and transformers' attention interface."""
    models = local_attention.transformers_models(model)
    # SDPA models only (banded on sliding layers): what the padded calls fall back to, and what `disable` restores
    plain = ("sdpa", local_attention.ATTENTION)
    if not models or any(part.config._attn_implementation not in plain for part in models) or not native_ops.load():
        return False
    _register()
    try:
        for part in models:
            part.set_attn_implementation(ATTENTION)
    except (ValueError, ImportError) as error:
        logger.warning("Per-text attention off, packed rows keep SDPA with the block mask: %s", error)
        disable(model)
        return False
    return True


def disable(model: torch.nn.Module) -> None:
    """Back to SDPA with the block mask (banded on sliding layers, local_attention.py)."""
    for part in local_attention.transformers_models(model):
        part.set_attn_implementation("sdpa")
    local_attention.enable(model)


def is_enabled(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == ATTENTION
