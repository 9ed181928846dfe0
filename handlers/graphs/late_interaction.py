"""ColBERT's pieces as PyLate has them: its settings, the compiled module and MaxSim.

The module is the transformer and the Dense projection (no bias, no activation) with each token's
vector normalized, so only projected vectors leave the graph. Query expansion's mask tokens are
not attended to unless the model says so: the module blocks them as keys (in the 2-D mask of a
padded call and in the block mask of a packed one), where PyLate's attention mask holds 0 for
them; as queries they still read the text. A mask token a text writes itself is blocked alike.
"""

import dataclasses
import string
from pathlib import Path

import torch

from ts_compiled_handlers.engine.packing import attention_inputs
from ts_compiled_handlers.graphs.model_files import module_folder

# PyLate's defaults for what a model's config_sentence_transformers.json leaves out
DEFAULTS = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
    "attend_to_expansion_tokens": False,
    "do_query_expansion": True,
    "skiplist_words": list(string.punctuation),
}


@dataclasses.dataclass(frozen=True)
class ColbertSettings:
    query_prefix: str
    document_prefix: str
    query_length: int
    document_length: int
    expansion_id: int | None  # the token queries are expanded with (the mask token); None: no expansion
    attends_expansion: bool
    skiplist_ids: frozenset[int]

    @classmethod
    def read(cls, saved: dict, tokenizer) -> "ColbertSettings":
        """The settings from config_sentence_transformers.json; the token ids from the tokenizer
        (None: lengths only, before it is loaded)."""
        value = {name: saved.get(name, default) for name, default in DEFAULTS.items()}
        if value["query_length"] > value["document_length"]:
            raise ValueError("config_sentence_transformers.json: query_length is longer than document_length")
        expansion = skiplist = None
        if tokenizer is not None:
            expansion = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id
            if value["do_query_expansion"] and expansion is None:
                raise ValueError("query expansion needs a mask token (or an end token); the tokenizer has neither")
            skiplist = frozenset(tokenizer.convert_tokens_to_ids(word) for word in value["skiplist_words"])
        return cls(
            value["query_prefix"],
            value["document_prefix"],
            int(value["query_length"]),
            int(value["document_length"]),
            expansion if value["do_query_expansion"] else None,
            bool(value["attend_to_expansion_tokens"]),
            skiplist or frozenset(),
        )

    @property
    def unattended_id(self) -> int | None:
        """The token the module blocks as a key: expansion's, unless the model attends to it."""
        return None if self.expansion_id is None or self.attends_expansion else self.expansion_id

    def query_ids(self, ids: list[int]) -> list[int]:
        """A query's ids cut at the query length (keeping its last, special token) and expanded to it."""
        if len(ids) > self.query_length:
            ids = ids[: self.query_length - 1] + ids[-1:]
        if self.expansion_id is None:
            return ids
        return ids + [self.expansion_id] * (self.query_length - len(ids))

    def kept_tokens(self, ids: list[int]) -> list[int]:
        """A document's positions whose vectors are answered: all but the skiplist's tokens."""
        return [position for position, token in enumerate(ids) if token not in self.skiplist_ids]


def read_projection(model_dir: Path) -> torch.Tensor:
    """The Dense module's weight (out, in), from safetensors; only a plain projection (no bias, no
    activation, no residual) is served, as PyLate saves it."""
    import json

    folder = module_folder(model_dir, "Dense") or model_dir / "1_Dense"
    config = json.loads((folder / "config.json").read_text())
    identity = config.get("activation_function", "torch.nn.modules.linear.Identity").endswith("Identity")
    if config.get("bias", True) or not identity or config.get("use_residual", False):
        raise ValueError(f"{folder.name}/config.json: only a projection without bias, activation or residual is served")
    if not (folder / "model.safetensors").is_file():
        raise ValueError(f"{folder.name}: its weights are served from model.safetensors only (no pickle)")
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))["linear.weight"].float()


class TokenVectors(torch.nn.Module):
    """The transformer, the projection and the normalization: (B, T, out) per token."""

    per_token = True

    def __init__(self, encoder: torch.nn.Module, projection: torch.Tensor, unattended_id: int | None):
        super().__init__()
        self.encoder = encoder
        self.projection = torch.nn.Linear(projection.shape[1], projection.shape[0], bias=False)
        with torch.no_grad():
            self.projection.weight.copy_(projection)
        self.unattended_id = unattended_id
        # keys blocked inside a text (query expansion's tokens): only the mask can say so
        self.per_text_attention = unattended_id is None

    def vectors(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(self.projection(hidden).float(), p=2, dim=-1)

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        if self.unattended_id is not None:  # attention_mask: additive (rows, 1, T, T)
            blocked = (input_ids == self.unattended_id)[:, None, None, :]
            attention_mask = attention_mask.masked_fill(blocked, torch.finfo(attention_mask.dtype).min)
        hidden = self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(self.encoder, segments),
        )[0]
        return self.vectors(hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.unattended_id is not None:
            attention_mask = attention_mask * (input_ids != self.unattended_id).to(attention_mask.dtype)
        return self.vectors(self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state)


def maxsim(query: torch.Tensor, document: torch.Tensor) -> float:
    """ColBERT's score: each query vector's best dot product with the document's vectors, summed."""
    return float((query @ document.T).max(dim=1).values.sum())
