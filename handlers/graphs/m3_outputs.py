"""bge-m3's graph: the XLM-R encoder and the two heads FlagEmbedding saves beside it
(`colbert_linear.pt`, `sparse_linear.pt`, read with `weights_only=True`), every token's three
outputs from one pass (the task, handlers/tasks/m3.py, takes from them what a request asks)."""

from pathlib import Path

import torch

from ts_compiled_handlers.engine.packing import attention_inputs

HEADS = ("colbert_linear.pt", "sparse_linear.pt")


def read_heads(model_dir: Path) -> tuple[dict, dict]:
    """The ColBERT and sparse heads' state dicts, loaded as tensors only (`weights_only=True`)."""
    missing = [name for name in HEADS if not (model_dir / name).is_file()]
    if missing:
        raise ValueError(f"{model_dir}: no {', '.join(missing)}; a bge-m3 model keeps its heads beside its weights")
    colbert, sparse = (torch.load(model_dir / name, map_location="cpu", weights_only=True) for name in HEADS)
    return colbert, sparse


def linear_from(state: dict) -> torch.nn.Linear:
    weight = state["weight"]
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in state)
    layer.load_state_dict(state)
    return layer.float()


class M3Outputs(torch.nn.Module):
    """The encoder and both heads: per token, (normalized state | sparse weight | normalized ColBERT vector)."""

    per_token = True

    def __init__(self, encoder: torch.nn.Module, colbert: dict, sparse: dict):
        super().__init__()
        self.encoder = encoder
        self.colbert_linear, self.sparse_linear = linear_from(colbert), linear_from(sparse)

    def outputs(self, hidden: torch.Tensor) -> torch.Tensor:
        dense = torch.nn.functional.normalize(hidden.float(), dim=-1)
        weight = torch.relu(self.sparse_linear(hidden)).float()
        colbert = torch.nn.functional.normalize(self.colbert_linear(hidden).float(), dim=-1)
        return torch.cat([dense, weight, colbert], dim=-1)

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        hidden = self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(self.encoder, segments),
        )[0]
        return self.outputs(hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.outputs(self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state)
