"""A long-context embedder's start: the grid up to its 8192-token limit, bounded by `buckets.max_tokens`.

A ModernBERT-base-shaped model (22 layers, hidden 768, 8192 positions; random weights, made here)
is started in this process as a worker starts it, with the default configuration: `seq_lens: auto`
(16, 32, ... 8192) x batches (1, 2, 4, 8), each call at most `max_tokens` tokens (4096). Reported:
the shapes warmed and their tokens, against the grid without the bound (not run: its 8 x 8192
rows alone are 64 times the bound), the seconds to ready and of the grid's pass, and the time of
the largest call.

    python benchmarks/benchmark_long_context.py      # prints a table, writes runs/benchmark_long_context.json
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.in_process import ready_handler
from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.scripts.make_tiny_models import make_modernbert_embedding


def grid_tokens(plan: buckets.BucketPlan) -> tuple[int, int]:
    """(shapes, tokens of one call at each) of the warm-up grid."""
    shapes = buckets.warmup_shapes(plan)
    return len(shapes), sum(rows * length for rows, length in shapes)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", help="the handler's dtype")
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_long_context.json", help="JSON output")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as temp:
        folder = make_modernbert_embedding(Path(temp) / "modernbert-long", "long")
        began = time.perf_counter()
        handler = ready_handler("embedding", folder, dtype=args.dtype, warmup={"iterations": 1})
        ready = time.perf_counter() - began
        engine, report = handler.engine, handler.started.report
        unbounded = buckets.BucketPlan(engine.plan.seq_lens, engine.plan.batch_sizes, engine.plan.dynamic)
        ids = handler.serving.probes.filler(engine.plan.max_seq_len, engine.plan.rows_for(engine.plan.max_seq_len))
        largest = measure.summarize(measure.time_calls(lambda: engine.run(ids, one_per_row=True), 1, 3, engine.device))
    shapes, tokens = grid_tokens(engine.plan)
    all_shapes, all_tokens = grid_tokens(unbounded)
    result = {
        "machine": measure.machine_summary(),
        "seq_lens": list(engine.plan.seq_lens),
        "max_tokens": engine.plan.max_tokens,
        "warmup_shapes": shapes,
        "warmup_tokens_per_pass": tokens,
        "unbounded_shapes": all_shapes,
        "unbounded_tokens_per_pass": all_tokens,
        "graphs": report.graphs,
        "ready_seconds": round(ready, 1),
        "grid_pass_seconds": round(report.warmup_seconds, 1),  # every shape once, compiling included
        "largest_call": {"shape": [len(ids), engine.plan.max_seq_len], "median_seconds": round(largest["median"], 2)},
        "recompiles_after_ready": engine.model.recompiles_after_ready,
    }
    print(result["machine"])
    print(f"grid {result['seq_lens']} x {list(engine.plan.batch_sizes)}, max_tokens {result['max_tokens']}")
    print(f"warm-up: {shapes} shapes, {tokens} tokens a pass (without the bound: {all_shapes}, {all_tokens})")
    print(
        f"ready {result['ready_seconds']} s, of which the grid's pass (compiling included)"
        f" {result['grid_pass_seconds']} s; {report.graphs} graphs"
    )
    print(f"largest call {result['largest_call']['shape']}: {result['largest_call']['median_seconds']} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
