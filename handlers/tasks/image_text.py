"""Image and text embeddings in one space (CLIP), each tower compiled and warmed before ready.

Texts run through the engine like any embedder's (token buckets, compiled, checked): the module
is the text tower and its projection, `get_text_features`. Images run through a second compiled
module, the vision tower and its projection (`get_image_features`), at the image processor's
size, over the plan's batch sizes: a call of n images is padded to the smallest batch size that
holds them, so live traffic meets only warmed shapes. A request mixes both
(`{"inputs": [{"image": "data:image/png;base64,..."}, {"text": "a cat"}]}`); its answers come back
in its order. Images are decoded under limits (handlers/request/images.py) and preprocessed by the
model's own image processor when the request is read, so a bad image fails its request alone.
"""

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ts_compiled_handlers.protocols import Protocol, Request, RequestSpec, Served
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.request.images import ImageLimits, decode_image
from ts_compiled_handlers.request.payload import RequestError, boolean_param, check_params, check_texts
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.tasks import Task

if TYPE_CHECKING:
    from ts_compiled_handlers.startup.config import HandlerConfig

logger = logging.getLogger(__name__)

NORM_EPS = 1e-12


class TextFeatures(torch.nn.Module):
    """The text tower and its projection: forward(input_ids, attention_mask) -> (batch, dim)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.text_model, self.text_projection = model.text_model, model.text_projection

    def forward(self, input_ids, attention_mask):
        states = self.text_model(input_ids=input_ids, attention_mask=attention_mask)
        return self.text_projection(states.pooler_output)


class ImageFeatures(torch.nn.Module):
    """The vision tower and its projection: forward(pixel_values) -> (batch, dim)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.vision_model, self.visual_projection = model.vision_model, model.visual_projection

    def forward(self, pixel_values):
        return self.visual_projection(self.vision_model(pixel_values=pixel_values).pooler_output)


@dataclasses.dataclass(frozen=True)
class ImageInputs:
    """The images of a request: where each stands among its inputs, and their pixels, preprocessed."""

    positions: list[int]
    pixels: torch.Tensor  # (images, 3, H, W) float32


class VisionRunner:
    """The vision module, compiled once per batch size of the plan; eager answers anything else
    after ready, counted in `recompiles_after_ready` (none does: calls are padded to a size)."""

    def __init__(self, eager: torch.nn.Module, compiled, batch_sizes: tuple[int, ...], device: torch.device):
        self.eager, self.compiled, self.batch_sizes, self.device = eager, compiled, batch_sizes, device
        self.recompiles_after_ready = 0

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """(n, 3, H, W) -> (n, dim) float32, in calls of the plan's batch sizes."""
        dtype = next(self.eager.parameters()).dtype
        rows = []
        with torch.inference_mode():
            for start in range(0, len(pixels), self.batch_sizes[-1]):
                chunk = pixels[start : start + self.batch_sizes[-1]]
                size = next(size for size in self.batch_sizes if size >= len(chunk))
                padded = torch.zeros((size, *chunk.shape[1:]), dtype=dtype, device=self.device)
                padded[: len(chunk)] = chunk.to(self.device, dtype)
                model = self.compiled if self.compiled is not None else self.eager
                rows.append(model(padded)[: len(chunk)].float().cpu())
        return torch.cat(rows)


def build_vision(model_dir: Path, serving, dtype: torch.dtype, pixels_of, check_drift) -> VisionRunner:
    """The vision module at `dtype`, compiled and warmed at every batch size, checked against
    float32 eager on probe images before ready (the text tower's checks are the engine's)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False)
    reference = ImageFeatures(model).eval().to(serving.device)
    probe = pixels_of([probe_image(seed) for seed in range(2)])
    with torch.inference_mode():
        expected = list(reference(probe.to(serving.device)).float().cpu())
    module = ImageFeatures(model).eval().to(serving.device, dtype)
    batch_sizes = tuple(sorted(serving.plan.batch_sizes))
    options = serving.compile_options
    compiled = None
    if options.enable:
        compiled = torch.compile(module, backend=options.backend, mode=options.mode, dynamic=False)
    runner = VisionRunner(module, compiled, batch_sizes, serving.device)
    for size in batch_sizes:  # every shape live traffic will meet
        runner(probe[:1].expand(size, *probe.shape[1:]))
    tolerance = serving.tolerance(dtype)
    check_drift("images, served vs float32 eager", list(runner(probe)), expected, tolerance)
    return runner


def probe_image(seed: int):
    """A deterministic picture with edges and gradients (a flat one checks little)."""
    from PIL import Image

    generator = np.random.default_rng(seed)
    pixels = (generator.random((48, 64, 3)) * 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


class ImageTextProtocol(Protocol):
    """The plain body with images: `{"inputs": [{"image": ...} | {"text": ...} | "text", ...]}`,
    or one image as a binary body with an image content type. Answered as the plain protocol."""

    routes = ("",)

    def __init__(self, task: "ImageTextTask"):
        self.task = task

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bytes):
            return True
        inputs = value.get("inputs") if isinstance(value, dict) else None
        items = inputs if isinstance(inputs, list) else [inputs]
        return any(isinstance(item, dict) and item.keys() & {"image", "text"} for item in items)  # not KServe v2's

    def read(self, value: Any, spec: RequestSpec) -> Request:
        if isinstance(value, bytes):
            return self.task.request([], [value], [0], {}, self, is_list=False)
        inputs = value["inputs"]
        items = inputs if isinstance(inputs, list) else [inputs]
        if not items:
            raise RequestError(400, "'inputs' is an empty list: send at least one text or image", "inputs")
        if len(items) > spec.max_inputs:
            raise RequestError(413, f"'inputs' has {len(items)} items; at most {spec.max_inputs} per request", "inputs")
        texts, images, positions = [], [], []
        for position, item in enumerate(items):
            kind, content = _item(item, position)
            if kind == "image":
                images.append(content)
                positions.append(position)
            else:
                texts.append(content)
        if texts:
            check_texts(texts, spec.max_inputs)
        params = check_params({name: param for name, param in value.items() if name != "inputs"}, spec.params)
        return self.task.request(texts, images, positions, params, self, isinstance(inputs, list))

    def encode(self, request: Request, answers: list, served: Served, prompt_tokens: int = 0) -> Any:
        return answers if request.is_list else answers[0]


def _item(item: Any, position: int) -> tuple[str, Any]:
    if isinstance(item, str):
        return "text", item
    if isinstance(item, dict) and len(item) == 1 and ("text" in item or "image" in item):
        kind = next(iter(item))
        return kind, item[kind]
    raise RequestError(400, f"'inputs'[{position}] must be a string, {{'text': ...}} or {{'image': ...}}", "inputs")


class ImageTextTask(Task):
    """Texts and images in, one embedding each out (`{"embedding": [...]}`), in the request's order."""

    NAME = "image-text-embedding"
    AOT = False  # the vision tower has no package yet (docs/tasks.md)

    def __init__(self, config: "HandlerConfig", continuous: bool = False):
        super().__init__(config, continuous)
        self.protocols = (ImageTextProtocol(self), KServeV2Protocol(), PlainProtocol())
        self.limits = ImageLimits()
        self.vision: VisionRunner | None = None

    def read_settings(self, serving) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(serving.model_dir)
        self.size = serving.model_config.projection_dim

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        from transformers import AutoModel

        model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False)
        return TextFeatures(model)

    def max_seq_len(self, model_dir: Path, config: "HandlerConfig") -> int | None:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model_dir).text_config.max_position_embeddings

    def build_side_models(self, serving, dtype: torch.dtype, check_drift) -> None:
        self.vision = build_vision(serving.model_dir, serving, dtype, self.pixels, check_drift)

    def pixels(self, images: list) -> torch.Tensor:
        """Images preprocessed exactly as the model's image processor does (resize, crop, normalize)."""
        return self.processor(images=images, return_tensors="pt")["pixel_values"].float()

    def request(self, texts: list, images: list, positions: list, params: dict, protocol, is_list: bool) -> Request:
        """A request whose images are decoded and preprocessed: a bad one is refused by name."""
        if not images:
            return Request(texts, params, protocol, is_list)
        decoded = [
            decode_image(image, f"inputs[{at}].image", self.limits) for image, at in zip(images, positions, strict=True)
        ]
        return Request(texts, params, protocol, is_list, form=ImageInputs(positions, self.pixels(decoded)))

    def param_checks(self) -> dict:
        return {**super().param_checks(), "normalize": boolean_param}

    def with_images(self, requests: list[Accepted], rows: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """Each request's rows in its inputs' order: its texts' rows, and its images' from one
        vision pass over every image of the call."""
        forms = [request.request.form for request in requests]
        batches = [form.pixels for form in forms if isinstance(form, ImageInputs)]
        if not batches:
            return rows
        image_rows = iter(self.vision(torch.cat(batches)).unbind(0))
        merged = []
        for form, text_rows in zip(forms, rows, strict=True):
            if not isinstance(form, ImageInputs):
                merged.append(text_rows)
                continue
            texts, ordered = iter(text_rows), []
            for position in range(len(text_rows) + len(form.positions)):
                ordered.append(next(image_rows) if position in form.positions else next(texts))
            merged.append(ordered)
        return merged

    def answer(self, accepted: Accepted, rows: list[torch.Tensor]) -> list:
        embeddings = np.stack([row.numpy() for row in rows])
        if accepted.request.params.get("normalize", False):
            embeddings = embeddings / np.maximum(np.linalg.norm(embeddings, axis=-1, keepdims=True), NORM_EPS)
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        return [{"embedding": vector} for vector in embeddings]
