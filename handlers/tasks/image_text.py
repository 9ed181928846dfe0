"""Image and text embeddings in one space (CLIP, SigLIP), each tower compiled and warmed before ready.

Texts run through the engine like any embedder's (token buckets, compiled, checked): the module
is the text tower and its projection, `get_text_features`. Images run through a second compiled
module, the vision tower and its projection (`get_image_features`), at the image processor's
size, over the plan's batch sizes: a call of n images is padded to the smallest batch size that
holds them, so live traffic meets only warmed shapes. A request mixes both
(`{"inputs": [{"image": "data:image/png;base64,..."}, {"text": "a cat"}]}`); its answers come back
in its order. Images are decoded under limits (handlers/request/images.py) and preprocessed by the
model's own image processor when the request is read, so a bad image fails its request alone.

SigLIP differs from CLIP in three places, each named where it is handled: its texts are padded to
the position table (64 tokens) and the padding is read (no mask), as it was trained; its images have
no class token; its zero-shot scores each label alone (a sigmoid, not a softmax over the labels).
"""

import dataclasses
import logging
import math
from pathlib import Path

import numpy as np
import torch

from ts_compiled_handlers.configuration.config import HandlerConfig
from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.graphs.image_features import ImageFeatures, TextFeatures
from ts_compiled_handlers.graphs.pooling import normalizes, unit_rows
from ts_compiled_handlers.protocols.image_bodies import (
    ImageCohereProtocol,
    ImageEmbeddingsProtocol,
    ImageInputs,
    ImageKServeProtocol,
    MixedInputsProtocol,
    ZeroShotForm,
    ZeroShotProtocol,
)
from ts_compiled_handlers.protocols.kserve_v2 import KServeV2Protocol
from ts_compiled_handlers.protocols.openai import ModelsProtocol
from ts_compiled_handlers.protocols.plain import PlainProtocol
from ts_compiled_handlers.request.answers import Label, Vector
from ts_compiled_handlers.request.images import ImageLimits, read_images
from ts_compiled_handlers.request.payload import boolean_param
from ts_compiled_handlers.request.tokenizing import Accepted
from ts_compiled_handlers.runtime import process_settings
from ts_compiled_handlers.tasks import MODEL_LOADING, Task

logger = logging.getLogger(__name__)


def is_siglip(model_config) -> bool:
    return model_config.model_type == "siglip"


class VisionRunner:
    """The vision module (compiled, its AOT package, or eager: `source`), called at the plan's batch
    sizes only: every call is padded to one warmed before ready, so none compiles after it
    (dynamo's graph count, which the tests hold, covers both towers)."""

    def __init__(self, model, dtype: torch.dtype, batch_sizes: tuple[int, ...], device: torch.device, source: str):
        self.model, self.dtype, self.batch_sizes, self.device, self.source = model, dtype, batch_sizes, device, source

    def __call__(self, pixels: torch.Tensor, prepare=None) -> torch.Tensor:
        """(n, 3, H, W) -> (n, dim) float32, in calls of the plan's batch sizes; `prepare` turns
        each call's held pixels into the model's (so only one call's are float at once)."""
        rows = []
        with torch.inference_mode():
            for start in range(0, len(pixels), self.batch_sizes[-1]):
                chunk = pixels[start : start + self.batch_sizes[-1]]
                chunk = prepare(chunk) if prepare is not None else chunk
                size = next(size for size in self.batch_sizes if size >= len(chunk))
                padded = torch.zeros((size, *chunk.shape[1:]), dtype=self.dtype, device=self.device)
                padded[: len(chunk)] = chunk.to(self.device, self.dtype)
                rows.append(self.model(padded)[: len(chunk)].float().cpu())
        return torch.cat(rows)

    def warm_and_check(self, probe: torch.Tensor, expected: list, name: str, check_drift, tolerance: float) -> None:
        """Every batch size live traffic will meet, then the probe's answers against `expected`."""
        for size in self.batch_sizes:
            self(probe[:1].expand(size, *probe.shape[1:]))
        check_drift(name, list(self(probe)), expected, tolerance)


def build_vision(module: ImageFeatures, serving, dtype: torch.dtype, pixels_of, check_drift) -> VisionRunner:
    """The float32 vision module cast to `dtype`, compiled and warmed at every batch size, checked
    against its float32 self on probe images before ready (the text tower's checks are the
    engine's). A compile or check that fails follows `compile.on_failure`: `eager` serves images
    eagerly (still checked at the dtype), `fail` fails the worker."""
    module, probe, expected = float32_answers(module, serving.device, pixels_of)
    module = module.to(dtype)
    batch_sizes = tuple(sorted(serving.plan.batch_sizes))
    options = serving.compile_options
    runner = VisionRunner(module, dtype, batch_sizes, serving.device, "eager")
    if options.enable:
        process_settings.allow_graphs(len(batch_sizes))  # past dynamo's limit a size would run eagerly, silently
        compiled = torch.compile(module, backend=options.backend, mode=options.mode, dynamic=False)
        runner = VisionRunner(compiled, dtype, batch_sizes, serving.device, "compiled")
    tolerance = serving.tolerance(dtype)
    try:
        runner.warm_and_check(probe, expected, "images, served vs float32 eager", check_drift, tolerance)
    except Exception as error:
        if runner.source == "eager" or options.on_failure == "fail":
            raise
        logger.error("Images served EAGERLY: the vision tower's compile or check failed", exc_info=error)
        runner = VisionRunner(module, dtype, batch_sizes, serving.device, "eager")
        check_drift("images, eager vs float32 eager", list(runner(probe)), expected, tolerance)
    return runner


def packaged_vision(package, serving, dtype: torch.dtype, check_drift) -> VisionRunner | None:
    """The vision tower from its AOT package (handlers/compiling/side_packages.py), warmed at every batch
    size and checked against the build's float32 answers; None, and why, where it fails."""
    batch_sizes = tuple(sorted(serving.plan.batch_sizes))
    runner = VisionRunner(
        lambda pixels: package(pixel_values=pixels), dtype, batch_sizes, serving.device, "aot package"
    )
    probe, expected = package.reference["pixel_values"], list(package.reference["rows"])
    try:
        name = "images, AOT package vs the build's float32 eager"
        runner.warm_and_check(probe, expected, name, check_drift, serving.tolerance(dtype))
    except Exception as error:  # other answers (the check's message says by how much), or a defect
        logger.warning(
            "AOT package aot_package/vision/ IGNORED, compiling that model instead: %s", error, exc_info=error
        )
        return None
    return runner


def float32_answers(module: ImageFeatures, device: torch.device, pixels_of) -> tuple[ImageFeatures, torch.Tensor, list]:
    """The float32 module on `device`, the probe images' pixels and its answers to them."""
    module = module.eval().to(device)
    probe = pixels_of([probe_image(seed) for seed in range(2)])
    with torch.inference_mode():
        expected = list(module(probe.to(device)).float().cpu())
    return module, probe, expected


def probe_image(seed: int):
    """A deterministic picture of noise (a flat one checks little)."""
    from PIL import Image

    generator = np.random.default_rng(seed)
    pixels = (generator.random((48, 64, 3)) * 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


@dataclasses.dataclass(frozen=True)
class LabelScores:
    """Zero-shot as the model was trained: CLIP a softmax over the labels of scale x cosine;
    SigLIP each label alone, sigmoid(scale x cosine + bias)."""

    scale: float
    bias: float | None  # SigLIP's; None: CLIP's softmax

    @classmethod
    def read(cls, model_dir: Path, siglip: bool) -> "LabelScores":
        """From the checkpoint, without building the model (a worker serving AOT packages builds none)."""
        from safetensors import safe_open

        wanted, found = {"logit_scale", *(("logit_bias",) if siglip else ())}, {}
        for path in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as checkpoint:
                found |= {key: checkpoint.get_tensor(key).float().item() for key in wanted & set(checkpoint.keys())}
        if wanted - set(found):
            raise ValueError(f"the checkpoint lacks {sorted(wanted - set(found))}: no zero-shot scores")
        return cls(math.exp(found["logit_scale"]), found.get("logit_bias"))

    def __call__(self, cosines: torch.Tensor) -> list[float]:
        logits = self.scale * cosines
        if self.bias is None:
            return torch.softmax(logits, dim=0).tolist()
        return torch.sigmoid(logits + self.bias).tolist()


class ImageTextTask(Task):
    """Texts and images in, one embedding each out (`{"embedding": [...]}`), in the request's order."""

    NAME = "image-text-embedding"

    def __init__(self, config: HandlerConfig, continuous: bool = False):
        super().__init__(config, continuous)
        bodies = (
            MixedInputsProtocol,
            ImageKServeProtocol,
            ImageEmbeddingsProtocol,
            ImageCohereProtocol,
            ZeroShotProtocol,
        )
        self.protocols = (
            *(body(self.read_images) for body in bodies),
            ModelsProtocol(),
            KServeV2Protocol(),
            PlainProtocol(),
        )
        self.limits = ImageLimits.of(config.images)
        self.vision: VisionRunner | None = None
        self.vision_float32: ImageFeatures | None = None  # from build_model's checkpoint, until compiled

    def read_settings(self, serving) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(serving.model_dir)
        self.draft_to = draft_size(self.processor)
        self.normalize_default = normalizes(serving.model_dir)  # a sentence-transformers folder's Normalize
        vision = serving.model_config.vision_config
        class_token = 0 if is_siglip(serving.model_config) else 1
        self.image_tokens = (vision.image_size // vision.patch_size) ** 2 + class_token
        self.label_scores = LabelScores.read(serving.model_dir, is_siglip(serving.model_config))

    def adapt_plan(self, plan: buckets.BucketPlan, config: HandlerConfig, model_config) -> buckets.BucketPlan:
        """SigLIP reads texts as it was trained: all padded to its position table, so one length."""
        if not is_siglip(model_config):
            return plan
        return dataclasses.replace(plan, seq_lens=(model_config.text_config.max_position_embeddings,), pack_tokens=None)

    def build_model(self, model_dir: Path) -> torch.nn.Module:
        """The text tower; the vision tower, still float32, is kept for `build_side_models` (or
        `build_side_packages`), so the checkpoint is read once."""
        model = load_clip(model_dir)
        self.vision_float32 = ImageFeatures(model)
        return TextFeatures(model, reads_padding=is_siglip(model.config))

    def build_side_models(self, serving, dtype: torch.dtype, check_drift, packages) -> None:
        """The vision tower from the archive's AOT package where it has one that serves, else compiled."""
        package = packages.load("vision") if packages is not None else None
        runner = packaged_vision(package, serving, dtype, check_drift) if package is not None else None
        module, self.vision_float32 = self.vision_float32, None
        if runner is None:
            module = module if module is not None else ImageFeatures(load_clip(serving.model_dir))
            runner = build_vision(module, serving, dtype, self.pixels, check_drift)
        how = {"eager": "EAGER", "compiled": "compiled", "aot package": "from its AOT package"}[runner.source]
        logger.info("Vision tower %s at batch sizes %s, checked against float32 eager", how, list(runner.batch_sizes))
        self.vision = runner

    def build_side_packages(self, serving, dtype: torch.dtype, packages) -> dict:
        """The vision tower's AOT package, with the float32 answers to the probe images a worker checks it against."""
        module, self.vision_float32 = self.vision_float32, None
        module, probe, expected = float32_answers(module, serving.device, self.pixels)
        reference = {"pixel_values": probe, "rows": torch.stack(expected)}
        row = {"pixel_values": probe.to(serving.device, dtype)}
        return {"vision": packages.build("vision", module.to(dtype), row, reference)}

    def side_sources(self) -> dict[str, str]:
        return {"vision": self.vision.source} if self.vision is not None else {}

    def pixels(self, images: list) -> torch.Tensor:
        """Images preprocessed exactly as the model's image processor does (resize, crop, normalize)."""
        return self.processor(images=images, return_tensors="pt")["pixel_values"].float()

    def held_pixels(self, image) -> torch.Tensor:
        """One image resized and cropped by the model's processor, not yet rescaled or normalized:
        8-bit where the processor's resize gives whole values (PIL's does), float32 otherwise."""
        pixels = self.processor(images=[image], return_tensors="pt", do_rescale=False, do_normalize=False)
        pixels = pixels["pixel_values"]
        if pixels.dtype != torch.uint8 and torch.equal(pixels, pixels.round().clamp(0, 255)):
            pixels = pixels.to(torch.uint8)
        return pixels if pixels.dtype == torch.uint8 else self.model_pixels(pixels)

    def model_pixels(self, held: torch.Tensor) -> torch.Tensor:
        """Held 8-bit pixels rescaled and normalized as the processor would have (floats as they are)."""
        if held.dtype != torch.uint8:
            return held
        processor, pixels = self.processor, held.float()
        if getattr(processor, "do_rescale", True):
            pixels = pixels * processor.rescale_factor
        if getattr(processor, "do_normalize", True):
            mean = torch.tensor(processor.image_mean, dtype=torch.float32).view(1, -1, 1, 1)
            pixels = (pixels - mean) / torch.tensor(processor.image_std, dtype=torch.float32).view(1, -1, 1, 1)
        return pixels

    def read_images(self, images: list, fields: list[str], positions: list[int]) -> ImageInputs:
        """Images decoded and preprocessed when the request is read, under the request's budget
        (handlers/request/images.py), one at a time, so that at most one is held at full size; kept
        as the processor's 8-bit pixels until the model call. A bad one is refused by name."""
        decoded = read_images(images, fields, self.limits, self.draft_to)
        pixels = [self.held_pixels(image) for image in decoded]
        return ImageInputs(positions, torch.cat(pixels), len(pixels) * self.image_tokens)

    def images_held(self, accepted: Accepted) -> int:
        images = accepted.request.images
        return len(images.positions) if isinstance(images, ImageInputs) else 0

    @property
    def images_budget(self) -> int:
        return self.config.images.batch_images

    def param_checks(self) -> dict:
        return {**super().param_checks(), "normalize": boolean_param}

    def with_images(self, requests: list[Accepted], rows: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """Each request's rows in its inputs' order: its texts' rows, and its images' from one
        vision pass over every image of the call."""
        forms = [request.request.images for request in requests]
        batches = [form.pixels for form in forms if isinstance(form, ImageInputs)]
        if not batches:
            return rows
        image_rows = iter(self.vision(torch.cat(batches), self.model_pixels).unbind(0))
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
        if isinstance(accepted.request.form, ZeroShotForm):
            return self.zero_shot(accepted.request.form.labels, rows)
        embeddings = np.stack([row.numpy() for row in rows])
        if accepted.request.params.get("normalize", self.normalize_default):
            embeddings = unit_rows(embeddings)
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        return [Vector(vector) for vector in embeddings]

    def zero_shot(self, labels: list[str], rows: list[torch.Tensor]) -> list:
        """The image (the first row) against each label's text, as transformers' pipeline scores
        them (`LabelScores`); best first."""
        image, texts = rows[0], torch.stack(rows[1:])
        cosines = torch.nn.functional.normalize(texts, dim=-1) @ torch.nn.functional.normalize(image, dim=0)
        scores = self.label_scores(cosines)
        ranked = sorted(zip(scores, labels, strict=True), key=lambda pair: -pair[0])
        return [Label(label, score) for score, label in ranked]


def draft_size(processor) -> tuple[int, int] | None:
    """Twice the processor's output size (width, height): a JPEG is decoded at the smallest DCT
    scale that still covers it, so the processor's own resize still shrinks it at least twofold."""
    size = getattr(processor, "size", None) or {}
    if "shortest_edge" in size:
        return 2 * size["shortest_edge"], 2 * size["shortest_edge"]
    if "height" in size and "width" in size:
        return 2 * size["width"], 2 * size["height"]
    return None  # a size this does not read: decoded whole, as sent


def load_clip(model_dir: Path) -> torch.nn.Module:
    """The whole model (both towers) in float32, from safetensors only."""
    from transformers import AutoModel

    with MODEL_LOADING:  # its vision tower is loaded apart from build_model: no load beside it either
        model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, use_safetensors=True, trust_remote_code=False)
    if getattr(model.config.vision_config, "vision_use_head", True) is False:
        raise ValueError("this SigLIP has no vision head (vision_use_head: false): no image embedding to serve")
    return model
