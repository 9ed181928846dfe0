"""One attention layer over the load test's packed rows: the per-text operator against SDPA under the
block-diagonal mask (what `pack_attention: auto` and `mask` run), in process.

The traffic is the load test's (token lengths lognormal, median 30, sigma 0.8, clipped to 5..256,
seeded) in batches of 32, packed by the product's packer into rows of 256 tokens; each batch's
rows get random queries, keys and values of a model's head shape (MiniLM: 12 heads of 32; a
BERT-base-sized model: 12 of 64), laid out as transformers' attention gets them. Both sides run
every batch, in alternation, and the table gives their summed time per layer and the ratio; the
operator's answers are checked against SDPA's on every batch's real tokens first.

    python benchmarks/benchmark_text_attention.py     # prints the table, writes runs/text_attention.json
"""

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from ts_compiled_handlers.benchmarks.traffic import traffic_lengths
from ts_compiled_handlers.engine import native_ops, packing, text_attention

SHAPES = {"minilm": (12, 32), "bert-base": (12, 64)}
BUDGET, SEQ_LENS = 256, (16, 32, 64, 128, 256)


def packed_segments(lengths: list[int]) -> torch.Tensor:
    """The batch's (rows, 256) segment ids as the packer lays the texts out."""
    rows = packing.pack_rows(lengths, BUDGET, SEQ_LENS)
    segments = torch.zeros(len(rows), BUDGET, dtype=torch.long)
    for row, texts in enumerate(rows):
        start = 0
        for slot, text in enumerate(texts, start=1):
            segments[row, start : start + lengths[text]] = slot
            start += lengths[text]
    return segments


def timed(call, repeats: int) -> float:
    began = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - began) / repeats


def compare(segments: torch.Tensor, heads: int, dim: int, dtype: torch.dtype, repeats: int) -> tuple[float, float]:
    """(operator seconds, SDPA-under-the-mask seconds) for one batch, after checking they agree."""
    rows, tokens = segments.shape
    query, key, value = (torch.randn(rows, tokens, heads, dim).to(dtype).transpose(1, 2) for _ in range(3))
    mask = packing.block_mask(segments, dtype)
    scale = dim**-0.5

    def per_text():
        return torch.ops.hfserve.text_attention(query, key, value, segments, scale, False, text_attention.DENSE_FROM)

    def masked():
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)

    real = segments > 0
    expected = masked().transpose(1, 2)[real].float()
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(per_text()[real].float(), expected, atol=tolerance, rtol=tolerance)
    return timed(per_text, repeats), timed(masked, repeats)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=480, help="requests in the traffic")
    parser.add_argument("--batch", type=int, default=32, help="requests per batch, in arrival order")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per batch and side")
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 requests, 1 repeat")
    parser.add_argument("--out", type=Path, default=Path("runs") / "text_attention.json", help="JSON output")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.repeats = 64, 1
    if not native_ops.load():
        raise SystemExit("the per-text attention operator could not be built here (the log says why)")
    lengths = traffic_lengths(args.requests, 0)
    batches = [packed_segments(lengths[start : start + args.batch]) for start in range(0, len(lengths), args.batch)]
    results = []
    for model, (heads, dim) in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            seconds = [compare(segments, heads, dim, dtype, args.repeats) for segments in batches]
            ours, sdpa = sum(s[0] for s in seconds), sum(s[1] for s in seconds)
            results.append({"model": model, "heads": heads, "dim": dim, "dtype": str(dtype).removeprefix("torch.")})
            results[-1].update({"per_text_seconds": ours, "masked_seconds": sdpa, "speedup": sdpa / ours})
    print_table(results, args, len(batches))
    flags = " ".join(sorted(native_ops._cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))
    machine = f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads, {flags}"
    result = {"machine": machine, "requests": args.requests, "batch": args.batch, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


def print_table(results: list[dict], args, batches: int) -> None:
    print(f"{args.requests} requests in {batches} batches of {args.batch}, packed into rows of {BUDGET}; one layer:")
    print(f"{'model':<10} {'heads x dim':>11} {'dtype':>9} {'per text ms':>12} {'mask ms':>9} {'speedup':>8}")
    for row in results:
        shape = f"{row['heads']} x {row['dim']}"
        ours, sdpa = row["per_text_seconds"] * 1e3, row["masked_seconds"] * 1e3
        print(f"{row['model']:<10} {shape:>11} {row['dtype']:>9} {ours:>12.2f} {sdpa:>9.2f} {row['speedup']:>7.2f}x")


if __name__ == "__main__":
    main()
