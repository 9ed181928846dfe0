"""sentence-transformers pooling, read from the model's own files and run inside the compiled graph."""

from pathlib import Path

import numpy as np
import torch

from ts_compiled_handlers.engine.packing import attention_inputs, pool_per_text
from ts_compiled_handlers.graphs.model_files import module_folder, read_json

# sentence-transformers' poolings as its Pooling config names them (`pooling_mode`, 6.x), and the
# older boolean flags for them, in the order it concatenates them.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "lasttoken")
LEGACY_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


NORM_EPS = 1e-12  # torch.nn.functional.normalize's floor on a vector's norm


def unit_rows(embeddings: np.ndarray) -> np.ndarray:
    """Each row over its L2 norm, as torch.nn.functional.normalize, in numpy (answers are built there)."""
    return embeddings / np.maximum(np.linalg.norm(embeddings, axis=-1, keepdims=True), NORM_EPS)


def pooling_modes(model_dir: Path) -> tuple[str, ...]:
    """The poolings of the model's Pooling module, in order (mean pooling if it has none)."""
    folder = module_folder(model_dir, "Pooling") or model_dir / "1_Pooling"
    config = read_json(folder / "config.json", {})
    modes = config.get("pooling_mode")
    if modes is None:
        modes = tuple(mode for flag, mode in LEGACY_FLAGS.items() if config.get(flag)) or ("mean",)
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    unsupported = [mode for mode in modes if mode not in POOLING_MODES]
    if unsupported:
        raise ValueError(f"{folder.name}/config.json pools {unsupported}; served poolings: {', '.join(POOLING_MODES)}")
    if config.get("include_prompt", True) is False:
        raise ValueError(f"{folder.name}/config.json pools without its prompt (include_prompt: false): not served")
    return modes


def normalizes(model_dir: Path) -> bool:
    return module_folder(model_dir, "Normalize") is not None


class SentenceEmbedder(torch.nn.Module):
    """The transformer and its pooling, as one module so that both are compiled together."""

    def __init__(self, encoder: torch.nn.Module, modes: tuple[str, ...], head: torch.nn.Module | None = None):
        super().__init__()
        self.encoder = encoder
        self.modes = modes
        self.head = head  # sentence-transformers' modules after the pooling (handlers/graphs/sentence_head.py)

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        """Each packed text's pooled embedding (rows, slots, H * modes), under a 4-D mask."""
        hidden = self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(self.encoder, segments),
        )[0]
        pooled = pool_per_text(hidden, segments, self.modes)
        return pooled if self.head is None else self.head(pooled)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        counts = mask.sum(dim=1).clamp(min=1e-9)  # (B, 1)
        last = (attention_mask.sum(dim=1) - 1).clamp(min=0)  # (B,) each right-padded row's last token
        pools = {
            "cls": lambda: hidden[:, 0],
            "max": lambda: hidden.masked_fill(mask == 0, -1e9).max(dim=1).values,
            "mean": lambda: (hidden * mask).sum(dim=1) / counts,
            "mean_sqrt_len_tokens": lambda: (hidden * mask).sum(dim=1) / counts.sqrt(),
            "lasttoken": lambda: hidden[torch.arange(hidden.shape[0], device=hidden.device), last],
        }
        pooled = torch.cat([pools[mode]() for mode in self.modes], dim=-1)  # (B, H * len(modes))
        return pooled if self.head is None else self.head(pooled)


class TokenStates(torch.nn.Module):
    """The transformer alone: each token's last hidden state (B, T, H), for an archive that keeps
    them (`embedding.embed_all`); its embeddings are pooled from them after the call (`pooled_rows`)."""

    per_token = True

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def packed(self, input_ids, attention_mask, position_ids, segments, token_type_ids=None) -> torch.Tensor:
        return self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **attention_inputs(self.encoder, segments),
        )[0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def pooled_rows(states: list[torch.Tensor], modes: tuple[str, ...], head: torch.nn.Module | None) -> list[torch.Tensor]:
    """Each text's embedding from its tokens' states (T, H), as SentenceEmbedder pools inside its
    graph, and through the modules after the pooling (`head`, float32, outside the graph)."""
    pools = {
        "cls": lambda row: row[0],
        "max": lambda row: row.max(dim=0).values,
        "mean": lambda row: row.mean(dim=0),
        "mean_sqrt_len_tokens": lambda row: row.sum(dim=0) / len(row) ** 0.5,
        "lasttoken": lambda row: row[-1],
    }
    pooled = [torch.cat([pools[mode](row) for mode in modes]) for row in states]
    if head is None:
        return pooled
    with torch.inference_mode():
        return list(head(torch.stack(pooled).float()).unbind())
