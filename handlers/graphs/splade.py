"""SPLADE: a masked-LM head's vocabulary logits pooled into one sparse vector per text, inside the graph.

sentence-transformers' SparseEncoder (a fill-mask Transformer, then SpladePooling) computes, per
text, `pool_t log1p(relu(logits[t] * mask[t]))` over its tokens, `pool` the max or the sum
(`activation_function: log1p_relu` takes log1p once more). The logits of a whole call are
(batch, tokens, vocabulary) floats: 2 GB for 32 x 512 texts of BERT's 30,522 words. Here the head's
last layer (the vocabulary projection) runs on a fixed number of vocabulary slices, each pooled
before the next is made, so a call holds one slice of logits at a time; the slice width is chosen
from the grid's largest call to keep that slice under `SLICE_BYTES`.
"""

import math
from pathlib import Path

import torch

from ts_compiled_handlers.engine.packing import attention_inputs, pool_per_text, sum_per_text
from ts_compiled_handlers.graphs.model_files import module_folder, read_json

STRATEGIES = ("max", "sum")
ACTIVATIONS = ("relu", "log1p_relu")
SLICE_BYTES = 64 * 2**20  # one vocabulary slice of a full call's logits, in float32


def pooling_settings(model_dir: Path) -> tuple[str, str]:
    """The SpladePooling module's (pooling_strategy, activation_function), as its config.json says."""
    folder = module_folder(model_dir, "SpladePooling")
    if folder is None:
        raise ValueError(f"{model_dir}/modules.json has no SpladePooling module: not a SPLADE sparse encoder")
    config = read_json(folder / "config.json", {})
    strategy, activation = config.get("pooling_strategy", "max"), config.get("activation_function", "relu")
    if strategy not in STRATEGIES or activation not in ACTIVATIONS:
        raise ValueError(
            f"{folder.name}/config.json: pooling_strategy {strategy!r}, activation_function {activation!r}; "
            f"served: {', '.join(STRATEGIES)} with {', '.join(ACTIVATIONS)}"
        )
    return strategy, activation


def slices_for(vocabulary: int, largest_call_tokens: int) -> int:
    """How many vocabulary slices keep one slice of a call's float32 logits under SLICE_BYTES."""
    per_slice = max(1, SLICE_BYTES // (4 * max(1, largest_call_tokens)))
    return math.ceil(vocabulary / per_slice)


def detach_output_layer(model: torch.nn.Module) -> torch.nn.Linear:
    """The masked LM's vocabulary projection, taken out of it (an Identity in its place), so that
    the model's `logits` are the head's last hidden states and the projection can run in slices."""
    projection = model.get_output_embeddings()
    for part in model.modules():
        for child_name, child in part.named_children():
            if child is projection:
                setattr(part, child_name, torch.nn.Identity())
                return projection
    raise ValueError(f"{type(model).__name__} has no output layer to split")


class SpladeEncoder(torch.nn.Module):
    """A masked LM (its projection detached) and SPLADE pooling: forward -> (texts, vocabulary)."""

    def __init__(self, masked_lm: torch.nn.Module, strategy: str, activation: str, slices: int):
        super().__init__()
        self.decoder = detach_output_layer(masked_lm)
        self.masked_lm = masked_lm
        self.strategy, self.activation = strategy, activation
        bounds = torch.linspace(0, self.decoder.out_features, slices + 1).round().long().tolist()
        self.bounds = list(zip(bounds[:-1], bounds[1:], strict=True))  # static: the same slices at every shape

    def _slices(self, states: torch.Tensor):
        """Each vocabulary slice's logits (..., tokens, slice) after relu, made one at a time."""
        weight, bias = self.decoder.weight, self.decoder.bias
        for start, stop in self.bounds:
            part_bias = None if bias is None else bias[start:stop]
            yield torch.nn.functional.linear(states, weight[start:stop], part_bias).float().relu()

    def _activate(self, pooled: torch.Tensor) -> torch.Tensor:
        return pooled.log1p() if self.activation == "relu" else pooled.log1p().log1p()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        states = self.masked_lm(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).float()  # (B, T, 1)
        pooled = []
        for logits in self._slices(states):
            if self.strategy == "max":  # log1p is increasing: the max of log1p is log1p of the max
                pooled.append(self._activate((logits * mask).amax(dim=1)))
            else:
                pooled.append((self._activate(logits) * mask).sum(dim=1))
        return torch.cat(pooled, dim=-1)  # (B, V)

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        """Each packed text's sparse vector (rows, slots, V), pooled over its own tokens."""
        states = self.masked_lm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(self.masked_lm, segments),
        ).logits
        pooled = []
        for logits in self._slices(states):
            if self.strategy == "max":
                pooled.append(self._activate(pool_per_text(logits, segments, ("max",)).clamp(min=0)))
            else:
                pooled.append(sum_per_text(self._activate(logits), segments))
        return torch.cat(pooled, dim=-1)
