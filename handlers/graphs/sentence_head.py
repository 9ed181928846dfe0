"""What sentence-transformers runs after an embedder's pooling, read from its modules.json: Dense
layers (a linear and an activation: LaBSE's and stella's projections) and Normalize, in their order.

A Normalize that comes last stays the request's `normalize` default, applied after `dimensions` cuts
the vector (as before); one before a Dense is part of the model. Any other module after the pooling
is refused by name: served without it, every answer would differ from `encode`'s, silently.
"""

import contextlib
import dataclasses
import importlib
from pathlib import Path

import torch

from ts_compiled_handlers.graphs.model_files import read_json

DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # sentence-transformers' Dense default
SERVED_AFTER_POOLING = ("Dense", "Normalize")


class Dense(torch.nn.Module):
    """sentence-transformers' Dense: `activation(linear(x))`, plus x (through `residual` where the
    sizes differ) under its `use_residual`."""

    def __init__(self, linear: torch.nn.Linear, activation: torch.nn.Module, residual: torch.nn.Module | None):
        super().__init__()
        self.linear, self.activation, self.residual = linear, activation, residual

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(pooled))
        return out if self.residual is None else out + self.residual(pooled)


class Normalize(torch.nn.Module):
    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(pooled, p=2, dim=-1)


@dataclasses.dataclass
class SentenceHead:
    """The modules after pooling (`layers`, None where there are none), whether a Normalize ends
    them, and the size they answer (None: the pooling's)."""

    layers: torch.nn.Sequential | None
    normalizes: bool
    size: int | None


def module_kind(module: dict) -> str:
    return str(module.get("type", "")).rpartition(".")[2]


def read_head(model_dir: Path) -> SentenceHead:
    """The embedder's modules after its Pooling module (none where it has no modules.json)."""
    modules = read_json(model_dir / "modules.json", [])
    kinds = [module_kind(module) for module in modules]
    after = modules[kinds.index("Pooling") + 1 :] if "Pooling" in kinds else []
    normalizes = bool(after) and module_kind(after[-1]) == "Normalize"
    layers, size = [], None
    for module in after[:-1] if normalizes else after:
        if module_kind(module) not in SERVED_AFTER_POOLING:
            served = " and ".join(SERVED_AFTER_POOLING)
            raise ValueError(f"modules.json: {module.get('type')} after the pooling is not served (only {served})")
        if module_kind(module) == "Normalize":
            layers.append(Normalize())
            continue
        dense = read_dense(model_dir / module.get("path", ""))
        layers.append(dense)
        size = dense.linear.out_features
    return SentenceHead(torch.nn.Sequential(*layers) if layers else None, normalizes, size)


def read_dense(folder: Path) -> Dense:
    """A Dense module from its folder: config.json and its weights (safetensors, else a pickle read
    with `weights_only`, as older models such as LaBSE save them)."""
    config = read_json(folder / "config.json", None)
    if config is None:
        raise ValueError(f"{folder.name}/config.json: missing (a Dense module's settings)")
    for key in ("module_input_name", "module_output_name"):
        if config.get(key) not in (None, "sentence_embedding"):
            raise ValueError(f"{folder.name}/config.json: {key} {config[key]!r}; served: sentence_embedding")
    weights = dense_weights(folder)
    sizes, bias = (config["in_features"], config["out_features"]), config.get("bias", True)
    linear = torch.nn.Linear(*sizes, bias=bias)
    linear.load_state_dict({"weight": weights["linear.weight"], **({"bias": weights["linear.bias"]} if bias else {})})
    residual = None
    if config.get("use_residual", False):
        residual = torch.nn.Identity() if sizes[0] == sizes[1] else torch.nn.Linear(*sizes, bias=False)
        if isinstance(residual, torch.nn.Linear):
            residual.load_state_dict({"weight": weights["residual.weight"]})
    return Dense(linear, activation(config.get("activation_function") or DEFAULT_ACTIVATION, folder), residual)


def dense_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ValueError(f"{folder.name}: no model.safetensors or pytorch_model.bin (a Dense module's weights)")


def activation(name: str, folder: Path) -> torch.nn.Module:
    """A torch.nn activation by its class's full name, made without arguments: what sentence-transformers
    loads without trust_remote_code (where it would fall back to Tanh, this refuses)."""
    module_name, _, class_name = name.rpartition(".")
    found = None
    if name.startswith("torch.nn."):
        with contextlib.suppress(ImportError):
            found = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(found, type) and issubclass(found, torch.nn.Module)):
        raise ValueError(f"{folder.name}/config.json: activation_function {name!r} is not a torch.nn module")
    return found()
