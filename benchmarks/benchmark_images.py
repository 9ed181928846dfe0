"""Images/s of a CLIP archive's vision tower, compiled and AOT-packaged against eager at the same dtype, in one process.

A random-weight CLIP of ViT-B/32's shape (scripts/make_tiny_models.py's `make_clip` at "b32":
vision tower hidden 768, 12 layers, 224 pixels in 32-pixel patches; text tower 512 wide, 12 layers)
is built as a worker builds it (`Worker.build`, `dtype: auto`, compiled, warmed, checked); then its
AOT packages are built (`hfserve build --precompile aot`'s step) and a second worker starts from
them. The vision module runs eagerly, compiled and from its package, timed in turns, at each batch
size of the grid (the pixels given: the model call alone). The read of one image is timed apart: a 640 x 480 JPEG
decoded and preprocessed by the model's processor (resize, crop, normalize), the other part of an
image's cost on a CPU. Weights are random: speed does not depend on them. Parity is measured too:
the least cosine of the served vectors (the archive's dtype; compiled, and from the AOT packages)
to transformers' `get_image_features` / `get_text_features` in float32 eager, on 8 pictures and 8 texts.

    python benchmarks/benchmark_images.py               # ViT-B/32 size, batches 1, 8, 32
    python benchmarks/benchmark_images.py --quick       # the tests' tiny CLIP, a smoke run
"""

import argparse
import base64
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.in_process import build_aot_package
from ts_compiled_handlers.configuration.placement import Placement
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.make_tiny_models import make_clip
from ts_compiled_handlers.tasks.image_text import ImageTextTask, probe_image
from ts_compiled_handlers.worker.worker import Worker


def photo_uri(width: int = 640, height: int = 480) -> str:
    """A JPEG data URI of a camera-sized picture with texture (noise compresses as a photo would not)."""
    from PIL import Image

    pixels = (np.random.default_rng(0).random((height, width, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def run(args) -> dict:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = make_clip(Path(scratch) / "clip", "test" if args.quick else "b32")
        config = {"dtype": args.dtype, "buckets": {"seq_lens": [16, 64], "batch_sizes": args.batches}}
        worker = Worker.build(Placement(model_dir, "clip", {"handler": config}), ImageTextTask)
        least_cosines = {"compiled": parity(worker, model_dir)}
        build_aot_package("image-text-embedding", model_dir, {"handler": config})
        packaged = Worker.build(Placement(model_dir, "clip", {"handler": config}), ImageTextTask)
        sources = {"texts": packaged.started.cache_source, **packaged.task.side_sources()}
        if sources != {"texts": "aot", "vision": "aot package"}:
            raise RuntimeError(f"the worker did not serve its AOT packages: {sources}, see the log")
        least_cosines["aot"] = parity(packaged, model_dir)
        rows = time_towers(worker.task.vision, packaged.task.vision, worker.task.processor.crop_size["height"], args)
    vision = worker.task.vision
    uri = photo_uri()
    read = measure.summarize(
        measure.time_calls(lambda: worker.task.read_images([uri], ["image"], [0]), 2, 20, vision.device)
    )
    return {
        "machine": measure.machine_summary(),
        "model": "tiny CLIP" if args.quick else "CLIP ViT-B/32 shape, random weights",
        "dtype": str(worker.engine.dtype).removeprefix("torch."),
        "rows": rows,
        "read_one_image_ms": round(read["median"] * 1000, 2),
        "least_cosine_to_float32": least_cosines,
    }


def time_towers(compiled, packaged, size: int, args) -> list[dict]:
    """Images/s of the vision module eager, compiled and from its package, timed in turns per batch."""
    eager = compiled.model._orig_mod  # torch.compile's module wraps the eager one
    rows = []
    for batch in args.batches:
        pixels = torch.randn(batch, 3, size, size).to(compiled.dtype)
        calls = {
            "eager": lambda p=pixels: eager(p),
            "compiled": lambda p=pixels: compiled.model(p),
            "aot": lambda p=pixels: packaged.model(p),
        }
        with torch.inference_mode():
            samples = measure.time_interleaved(calls, args.warmup, args.iterations, compiled.device)
        found = {name: measure.summarize(values) for name, values in samples.items()}
        per_second = {name: batch / found[name]["median"] for name in calls}
        noisy = any(summary["noisy"] for summary in found.values())
        ratios = {"x": per_second["compiled"] / per_second["eager"], "aot_x": per_second["aot"] / per_second["eager"]}
        rows.append({"batch": batch, **per_second, **ratios, "noisy": noisy})
    return rows


PARITY_TEXTS = ["a photo of a cat", "two dogs", "the red house by the river", "a", "berlin at night"] + [
    "a long description of a picture with many words in it " * 3,
    "hello world",
    "blue",
]


def parity(worker, model_dir: Path) -> dict:
    """The least cosine, images and texts apart, of the served vectors to float32 eager transformers'."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pixels = worker.task.pixels([probe_image(seed) for seed in range(10, 18)])
    limit = worker.engine.plan.max_seq_len
    ids = tokenizer(PARITY_TEXTS, truncation=True, max_length=limit)["input_ids"]
    with torch.inference_mode():
        served = {"images": worker.task.vision(pixels), "texts": torch.stack(worker.engine.run(ids).rows).float()}
        tokens = tokenizer(PARITY_TEXTS, padding=True, truncation=True, max_length=limit, return_tensors="pt")
        want = {
            "images": model.get_image_features(pixel_values=pixels).pooler_output,
            "texts": model.get_text_features(**tokens).pooler_output,
        }
    return {kind: torch.cosine_similarity(served[kind], want[kind], dim=-1).min().item() for kind in served}


def print_table(result: dict) -> None:
    print(f"{result['model']}, {result['dtype']}; {result['machine']}")
    print("images/s of the vision tower (pixels given), eager, compiled and AOT package timed in turns")
    print(f"{'batch':>5} {'eager':>10} {'compiled':>10} {'x':>6} {'aot':>10} {'x':>6}")
    for row in result["rows"]:
        line = f"{row['batch']:>5} {row['eager']:>10.1f} {row['compiled']:>10.1f} {row['x']:>6.2f}"
        line += f" {row['aot']:>10.1f} {row['aot_x']:>6.2f}"
        print(line + (" noisy" if row["noisy"] else ""))
    print(f"reading one 640 x 480 JPEG (decode, resize, crop, normalize): {result['read_one_image_ms']} ms")
    for how, least in result["least_cosine_to_float32"].items():
        kinds = ", ".join(f"{kind} {value:.5f}" for kind, value in least.items())
        print(f"least cosine to float32 eager transformers, {how}: {kinds}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tests' tiny CLIP, few iterations (a smoke run)")
    parser.add_argument("--dtype", default="auto", help="the archive's dtype (default auto)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="the grid's batch sizes")
    parser.add_argument("--iterations", type=int, default=10, help="timed calls per contender and batch")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    parser.add_argument("--out", type=Path, default=Path("runs/benchmark_images.json"), help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.iterations = [1, 4], 3
    result = run(args)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
