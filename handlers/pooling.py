"""sentence-transformers pooling, read from the model's own files and run inside the compiled graph."""

import json
from pathlib import Path
from typing import Any

import torch

from handlers.packing import pool_per_text

# sentence-transformers concatenates the enabled poolings in this order.
POOLING_MODES = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens")
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"


def read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.is_file() else default


def pooling_modes(model_dir: Path) -> tuple[str, ...]:
    """The enabled poolings of the model's Pooling module (mean pooling if it has none)."""
    modules = read_json(model_dir / "modules.json", [])
    folder = next((m["path"] for m in modules if m["type"].endswith(".Pooling")), "1_Pooling")
    config = read_json(model_dir / folder / "config.json", {"pooling_mode_mean_tokens": True})
    unsupported = [
        key
        for key, on in config.items()
        if key.startswith("pooling_mode_") and on and key.removeprefix("pooling_mode_") not in POOLING_MODES
    ]
    if unsupported:
        raise ValueError(f"{folder}/config.json enables {unsupported}; supported poolings: {', '.join(POOLING_MODES)}")
    return tuple(mode for mode in POOLING_MODES if config.get(f"pooling_mode_{mode}"))


def normalizes(model_dir: Path) -> bool:
    modules = read_json(model_dir / "modules.json", [])
    return any(module["type"] == NORMALIZE_MODULE for module in modules)


class SentenceEmbedder(torch.nn.Module):
    """The transformer and its pooling, as one module so that both are compiled together."""

    def __init__(self, encoder: torch.nn.Module, modes: tuple[str, ...]):
        super().__init__()
        self.encoder = encoder
        self.modes = modes

    def packed(self, input_ids, attention_mask, position_ids, segments) -> torch.Tensor:
        """Each packed text's pooled embedding (rows, slots, H * modes), under a 4-D mask."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)[0]
        return pool_per_text(hidden, segments, self.modes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        counts = mask.sum(dim=1).clamp(min=1e-9)  # (B, 1)
        pooled = {
            "cls_token": lambda: hidden[:, 0],
            "max_tokens": lambda: hidden.masked_fill(mask == 0, -1e9).max(dim=1).values,
            "mean_tokens": lambda: (hidden * mask).sum(dim=1) / counts,
            "mean_sqrt_len_tokens": lambda: (hidden * mask).sum(dim=1) / counts.sqrt(),
        }
        return torch.cat([pooled[mode]() for mode in self.modes], dim=-1)  # (B, H * len(modes))
