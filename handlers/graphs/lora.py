"""LoRA adapters served side by side (`handler.adapters`): one model call for a batch whose texts
each name their own adapter, or none (the base model).

Each adapter is a folder PEFT saved (`adapter_config.json`, `adapter_model.safetensors`), packed in
the archive under `adapters/NAME/`. Every linear layer an adapter targets becomes an `AdaptedLinear`
that holds all adapters' low-rank factors stacked, each padded to the largest rank `R` and its
scale folded into the up projection:

    y = x W^T + b + ((x @ down) * gate) @ up
        x (..., in), down (in, N * R), gate (..., N * R), up (N * R, out)

`gate` is 1 over the columns of each token's own adapter and 0 elsewhere (all 0 for the base
model), so the base weights run once for the whole call and each token gets its own adapter's
update; the extra work is 2 * N * R / out of the layer's (12% for three rank-8 adapters on a
384-wide layer). The gate is made once per call from the `adapter_ids` input (rows, seq_len: 0 the
base, k the k-th adapter) by `Adapted`, the outermost module, and read by every adapted layer
through the `Gate` they share; an adapter's id is a value, never a shape, so no mix of adapters
compiles anything new.

Files are checked like weights: safetensors only, LoRA only (no DoRA, no trained biases or
`modules_to_save`), every factor's shape matched to the layer it adapts.
"""

import dataclasses
import json
import re
from pathlib import Path

import torch

FOLDER = "adapters"  # inside the archive: adapters/NAME/{adapter_config.json, adapter_model.safetensors}
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
FACTOR = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<factor>[AB])(?:\.[^.]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter folder that cannot be served, and why."""


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One LoRA adapter: its name, its scale (alpha / r, or / sqrt(r) with rsLoRA) and its factors by
    the module path they adapt: (A (r, in), B (out, r))."""

    name: str
    scale: float
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]


def read_adapter(name: str, folder: Path) -> Adapter:
    """The adapter PEFT saved in `folder`, or AdapterError saying what it holds that cannot be served."""
    config_path, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file() or not weights.is_file():
        bin_only = (folder / "adapter_model.bin").is_file()
        why = "only adapter_model.bin (pickle): save it with safe_serialization" if bin_only else "no adapter"
        raise AdapterError(f"adapter {name}: {folder} holds {why}; {CONFIG_FILE} and {WEIGHTS_FILE} are needed")
    try:
        config = json.loads(config_path.read_text())
        rank, alpha = int(config["r"]), float(config.get("lora_alpha", config["r"]))
    except (ValueError, KeyError, TypeError) as error:
        raise AdapterError(
            f"adapter {name}: {CONFIG_FILE} holds no LoRA rank `r` and `lora_alpha`: {error!r}"
        ) from error
    refused = {
        "peft_type": config.get("peft_type", "LORA") != "LORA",
        "use_dora": bool(config.get("use_dora")),
        "bias": config.get("bias", "none") != "none",
        "modules_to_save": bool(config.get("modules_to_save")),
        "rank_pattern": bool(config.get("rank_pattern")),
        "alpha_pattern": bool(config.get("alpha_pattern")),
        "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
    }
    if any(refused.values()):
        keys = ", ".join(key for key, bad in refused.items() if bad)
        raise AdapterError(f"adapter {name}: {keys} in {CONFIG_FILE}: only plain LoRA on linear layers is served")
    scale = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    from safetensors.torch import load_file

    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(weights).items():
        match = FACTOR.match(key)
        if match is None:
            raise AdapterError(f"adapter {name}: {WEIGHTS_FILE} holds {key}, which is no LoRA factor")
        pairs.setdefault(match["module"], {})[match["factor"]] = tensor.float()
    factors = {}
    for module, pair in pairs.items():
        if set(pair) != {"A", "B"} or pair["A"].shape[0] != rank or pair["B"].shape[1] != rank:
            raise AdapterError(f"adapter {name}: {module}'s factors are not a rank-{rank} pair (lora_A, lora_B)")
        factors[module] = (pair["A"], pair["B"])
    return Adapter(name, scale, factors)


class Gate:
    """What the adapted layers of one model share: the current call's gate (None: the base model)."""

    def __init__(self):
        self.current: torch.Tensor | None = None


class AdaptedLinear(torch.nn.Module):
    """A linear layer and every adapter's low-rank update of it, each token gated to its own."""

    def __init__(self, base: torch.nn.Linear, down: torch.Tensor, up: torch.Tensor, gate: Gate):
        super().__init__()
        self.base = base
        self.register_buffer("down", down.to(base.weight.dtype))  # (in, N * R)
        self.register_buffer("up", up.to(base.weight.dtype))  # (N * R, out), scales folded in
        self.gate = gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        gate = self.gate.current  # (rows, seq, N * R)
        if gate is None:  # a call without adapter ids: the base model (checks before `Adapted` wraps it)
            return out
        if x.dim() == 2:  # a head over each row's first token (BERT's pooler): that token's adapter
            gate = gate[:, 0]
        return out + ((x @ self.down) * gate) @ self.up


class Adapted(torch.nn.Module):
    """The served module with its adapters: forward(adapter_ids, **inputs), `adapter_ids` (rows,
    seq_len) each token's adapter (0: none); the rest as the module takes them."""

    def __init__(self, module: torch.nn.Module, gate: Gate, adapters: int, rank: int):
        super().__init__()
        self.module, self.gate, self.adapters, self.rank = module, gate, adapters, rank

    @property
    def layers(self) -> int:
        """The adapted linear layers."""
        return sum(isinstance(part, AdaptedLinear) for part in self.module.modules())

    def forward(self, adapter_ids: torch.Tensor, **inputs) -> torch.Tensor:
        dtype = next(self.module.parameters()).dtype
        chosen = torch.nn.functional.one_hot(adapter_ids, self.adapters + 1)[..., 1:].to(dtype)  # (rows, seq, N)
        self.gate.current = chosen.repeat_interleave(self.rank, -1)  # (rows, seq, N * R)
        output = self.module(**inputs)
        self.gate.current = None
        return output


def layer_for(module: torch.nn.Module, path: str, names: dict[str, torch.nn.Module]) -> str:
    """The qualified name in `module` of the layer PEFT's `path` names: the one whose name ends with
    it (PEFT's path is from the model it wrapped, which may sit inside ours, or hold ours)."""
    parts = path.split(".")
    for start in range(len(parts)):
        suffix = ".".join(parts[start:])
        found = [name for name in names if name == suffix or name.endswith("." + suffix)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            break
    raise AdapterError(f"{path} names no single layer of the model")


def in_blocks(name: str) -> bool:
    """Whether a layer sits in the model's repeated blocks (`....layer.3.attention...`), which run
    over every token; outside them, a head (a pooler, a classifier) runs over a text's first token."""
    return re.search(r"\.\d+\.", f".{name}.") is not None


def attach(module: torch.nn.Module, adapters: list[Adapter]) -> tuple[Gate, int, list[str]]:
    """Every layer an adapter targets replaced, in place, by an AdaptedLinear holding all adapters
    (those that do not target it: zeros); the gate they share, the padded rank, and the adapted
    layers outside the repeated blocks (heads: they need a text's first token at the start of a row)."""
    rank = max(pair[0].shape[0] for adapter in adapters for pair in adapter.factors.values())
    names = dict(module.named_modules())
    targets: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor, float]]] = {}
    for number, adapter in enumerate(adapters):
        for path, (down, up) in adapter.factors.items():
            targets.setdefault(layer_for(module, path, names), {})[number] = (down, up, adapter.scale)
    gate = Gate()
    for name, updates in targets.items():
        base = names[name]
        if not isinstance(base, torch.nn.Linear):
            raise AdapterError(f"{name} is a {type(base).__name__}: adapters are served on linear layers only")
        down = torch.zeros(base.in_features, len(adapters) * rank)
        up = torch.zeros(len(adapters) * rank, base.out_features)
        for number, (a, b, scale) in updates.items():
            if a.shape[1] != base.in_features or b.shape[0] != base.out_features:
                raise AdapterError(
                    f"adapter {adapters[number].name}: {name} is {base.in_features} -> {base.out_features}, "
                    f"its factors {tuple(a.shape)} and {tuple(b.shape)}"
                )
            columns = slice(number * rank, number * rank + a.shape[0])
            down[:, columns], up[columns] = a.T, b.T * scale
        parent, _, leaf = name.rpartition(".")
        setattr(names[parent] if parent else module, leaf, AdaptedLinear(base, down, up, gate))
    return gate, rank, [name for name in targets if not in_blocks(name)]


def read_all(model_dir: Path, names: tuple[str, ...]) -> list[Adapter]:
    """The archive's adapters, in the order the configuration names them (ids 1, 2, ...)."""
    return [read_adapter(name, Path(model_dir) / FOLDER / name) for name in names]
