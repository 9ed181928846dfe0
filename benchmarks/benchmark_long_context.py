"""A long-context embedder's start: the grid up to its 8192-token limit, bounded by `buckets.max_tokens`.

A ModernBERT-base-shaped model (22 layers, hidden 768, 8192 positions; random weights, made here)
is started in this process as a worker starts it, with the default configuration: `seq_lens: auto`
(16, 32, ... 8192) x batches (1, 2, 4, 8), each call at most `max_tokens` tokens (4096). Reported:
the shapes warmed and their tokens, against the grid without the bound (not run: its 8 x 8192
rows alone are 64 times the bound), the seconds to ready and of the grid's pass, and the time of
the largest call: one text at the limit, served, against the limit of this machine for it (its
FLOPs, the local layers' attention counted at their window, over the rate of a matmul of the
model's own shape timed in this run at the served dtype) and against the same text through the
model as transformers runs it (SDPA under the banded mask on the local layers, eager).

    python benchmarks/benchmark_long_context.py                    # float32
    python benchmarks/benchmark_long_context.py --dtype bfloat16   # the dtype `auto` picks on AVX512-BF16
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
from ts_compiled_handlers.startup import start_cost


def grid_tokens(plan: buckets.BucketPlan) -> tuple[int, int]:
    """(shapes, tokens of one call at each) of the warm-up grid."""
    shapes = buckets.warmup_shapes(plan)
    return len(shapes), sum(rows * length for rows, length in shapes)


def limit_seconds(folder: Path, tokens: int, dtype) -> dict:
    """One text's FLOPs over the rate of this model's widest matmul (tokens x hidden x 3 hidden) here,
    its best of 20 calls (what this machine can do; a VM's neighbours slow single calls)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    left = torch.randn(tokens, config.hidden_size, dtype=dtype)
    right = torch.randn(config.hidden_size, 3 * config.hidden_size, dtype=dtype)
    seconds = min(measure.time_calls(lambda: left @ right, 2, 20, torch.device("cpu")))  # the best: the machine's
    rate = 2 * tokens * config.hidden_size * 3 * config.hidden_size / seconds
    flop = start_cost.text_flop(config, start_cost.linear_weights(folder), tokens)
    return {"flop": flop, "rate": rate, "seconds": flop / rate}


def transformers_call_seconds(folder: Path, dtype, token_ids: list[int]) -> float:
    """One text through the model as transformers runs it (SDPA, the local layers under their mask), eager."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval().to(dtype)
    ids = torch.tensor([token_ids])
    with torch.inference_mode():
        samples = measure.time_calls(lambda: model(input_ids=ids), 0, 1, torch.device("cpu"))
    return measure.summarize(samples)["median"]


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
        masked = transformers_call_seconds(folder, engine.dtype, ids[0])
        limit = limit_seconds(folder, engine.plan.max_seq_len, engine.dtype)
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
        "dtype": str(engine.dtype).removeprefix("torch."),
        "longest_text": {
            "served_seconds": round(largest["median"], 2),
            "transformers_masked_seconds": round(masked, 2),
            "limit_seconds": round(limit["seconds"], 2),
            "tflop": round(limit["flop"] / 1e12, 2),
            "matmul_gflops": round(limit["rate"] / 1e9),
            "served_over_limit": round(largest["median"] / limit["seconds"], 2),
        },
    }
    print(result["machine"])
    print(f"grid {result['seq_lens']} x {list(engine.plan.batch_sizes)}, max_tokens {result['max_tokens']}")
    print(f"warm-up: {shapes} shapes, {tokens} tokens a pass (without the bound: {all_shapes}, {all_tokens})")
    print(
        f"ready {result['ready_seconds']} s, of which the grid's pass (compiling included)"
        f" {result['grid_pass_seconds']} s; {report.graphs} graphs"
    )
    print(f"largest call {result['largest_call']['shape']}: {result['largest_call']['median_seconds']} s")
    longest = result["longest_text"]
    print(
        f"one {engine.plan.max_seq_len}-token text at {result['dtype']}: served {longest['served_seconds']} s, "
        f"transformers (masked, eager) {longest['transformers_masked_seconds']} s, this machine's limit "
        f"{longest['limit_seconds']} s ({longest['tflop']} TFLOP at {longest['matmul_gflops']} GFLOP/s): "
        f"{longest['served_over_limit']}x the limit"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
