"""The CUDA path proved in one run, in process and without TorchServe: the check for the day a GPU is lent.

    python -m ts_compiled_handlers.benchmarks.gpu_check          # a GPU: BERT-base and MiniLM sizes (< 8 min, H100)
    python -m ts_compiled_handlers.benchmarks.gpu_check --dry    # the same code on the CPU, one tiny model (~1 min)

Random-weight BERT encoders in sentence-transformers' layout (scripts/make_tiny_models.py) are served
by workers built with `Worker.build` (handlers/worker/worker.py), as every server builds them; nothing
here imports `ts`. Every check is computed in this run and written to --out (passed, failed or not
applicable, with what it measured):

  tf32             capability >= 8.0: the hardware line logged at import says TF32 matmuls are on,
                   and float32 matmul precision is "high" (without CUDA: not applicable)
  auto dtype       `dtype: auto` resolves to bfloat16 on such a GPU (float16 below 8.0; on the
                   CPU, bfloat16 only with AMX or AVX512-BF16, else float32)
  compile <mode>   `default` and `reduce-overhead` each warm every bucket of the grid; after ready,
                   live requests, every bucket again and the timed calls compile nothing
                   (RecompilesAfterReady 0, no new dynamo graph); reduce-overhead records CUDA
                   graphs and skips none (the CPU has none: not applicable in the dry run, and
                   `--modes default reduce-overhead` runs it there as inductor does, as `default`)
  parity <source>  each worker's answers through the request path (accept, run, reply) against
                   sentence-transformers' `encode` of the same folder in float32: min cosine
                   >= 0.999 in bfloat16 or float16, >= 0.9999 in float32
  aot package      a package built in process (as `hfserve build --precompile aot` builds it) and a
                   worker that serves from it (model_source "aot package", no dynamo graph)
  no torchserve    no `ts` module was imported

Then texts/s per shape through the engine (padding, the copy to the device, the model, rows back):
eager against each compiled worker, the two timed in turns within that worker's own pass.
The JSON is rewritten after each stage, so a run cut short keeps what it measured.
"""

import argparse
import dataclasses
import functools
import json
import logging
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

HARDWARE_LOGGER = "ts_compiled_handlers.runtime.hardware"
MODES = ("default", "reduce-overhead")
WORDS = (
    "the a cat dog sat on mat hello world fast model serve token paris london berlin alice bob carol "
    "city river house red green blue runs walks sees likes"
).split()


@dataclasses.dataclass(frozen=True)
class Profile:
    """What one run covers: models (name -> make_tiny_models size), the bucket grid, the timed shapes."""

    models: dict
    aot_models: tuple
    grid: dict
    shapes: tuple
    warmup: int
    iterations: int


GPU = Profile(
    models={"bert-base": "base", "minilm": "minilm"},
    aot_models=("minilm",),
    grid={"seq_lens": [16, 64, 128], "batch_sizes": [1, 8, 32]},
    shapes=((1, 16), (8, 64), (32, 64), (32, 128)),
    warmup=3,
    iterations=20,
)
DRY = Profile(
    models={"tiny": "test"},  # hidden 32, 2 layers
    aot_models=("tiny",),
    grid={"seq_lens": [8, 16, 32], "batch_sizes": [1, 4]},
    shapes=((1, 8), (4, 16), (4, 32)),
    warmup=1,
    iterations=3,
)


class Lines(logging.Handler):
    """Keeps the messages of a logger, as they are logged."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def listen_to_hardware() -> tuple[Lines, str]:
    """The hardware line that `detect()` logs once per process, captured: at this first detection,
    or, where the process had detected before this check began, at a detection made again."""
    lines = Lines()
    logger = logging.getLogger(HARDWARE_LOGGER)
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    from ts_compiled_handlers.runtime import hardware

    when = "first detection in this process"
    if hardware.detect.cache_info().currsize:
        hardware.detect.cache_clear()
        when = "detected again: the process had detected before this check"
    hardware.detect()
    return lines, when


@dataclasses.dataclass
class Run:
    """One run's settings and everything it found, written to `out` after each stage."""

    args: argparse.Namespace
    profile: Profile
    scratch: Path
    device: torch.device
    result: dict
    began: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def gpu_id(self) -> int | None:
        return self.device.index if self.device.type == "cuda" else None

    def add(self, name: str, model: str | None, passed: bool | None, detail: dict, why: str = "") -> None:
        """A check: passed (True), failed (False) or not applicable (None, `why` says why)."""
        status = {True: "passed", False: "failed", None: "not applicable"}[passed]
        self.result["checks"].append({"check": name, "model": model, "status": status, "why": why, **detail})
        flag = {"passed": "ok ", "failed": "FAIL", "not applicable": "n/a"}[status]
        print(f"[{flag}] {name}{f' ({model})' if model else ''}{f': {why}' if why else ''}", flush=True)

    def save(self) -> None:
        self.result["seconds"]["total"] = round(time.perf_counter() - self.began, 1)
        checks = self.result["checks"]
        finished = self.result["running"] is None and self.result["finished"]
        self.result["passed"] = finished and bool(checks) and all(check["status"] != "failed" for check in checks)
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        self.args.out.write_text(json.dumps(self.result, indent=2, default=str))

    def stage(self, name: str, model: str | None, step, *args):
        """Run one stage; an exception is a failed check (with its traceback), and the run goes on.
        The JSON names the stage while it runs: a crash (a segfault in native code) leaves it there."""
        began = time.perf_counter()
        self.result["running"] = f"{name} {model or ''}".strip()
        self.save()
        try:
            return step(self, *args)
        except Exception as error:
            tail = traceback.format_exc().splitlines()[-12:]
            self.add(name, model, False, {"error": f"{type(error).__name__}: {error}", "traceback": tail})
            return None
        finally:
            self.result["seconds"][self.result["running"]] = round(time.perf_counter() - began, 1)
            self.result["running"] = None
            self.save()

    def handler_config(self, mode: str) -> dict:
        """`dtype: auto`, the profile's grid, the compile mode; no host cache, so every worker compiles.
        On the CPU, freezing off, as `freezing: auto` has it on a GPU (and the dry run compiles sooner)."""
        compile_options = {"mode": mode, "cache_dir": "off", "on_failure": "eager"}
        if self.device.type == "cpu":
            compile_options["freezing"] = False
        return {"task": "embedding", "dtype": "auto", "buckets": dict(self.profile.grid), "compile": compile_options}

    def placement(self, model_dir: Path, name: str, mode: str):
        from ts_compiled_handlers.configuration.placement import Placement

        return Placement(model_dir, name, {"handler": self.handler_config(mode)}, gpu_id=self.gpu_id)


# -- the checks ------------------------------------------------------------------------------------
def check_tf32(run: Run, lines: Lines, when: str) -> None:
    from ts_compiled_handlers.runtime import hardware

    found = hardware.detect()
    logged = [message for message in lines.messages if message.startswith("Hardware:")]
    precision = torch.get_float32_matmul_precision()
    detail = {"logged": logged, "logged_at": when, "tf32": found.tf32, "float32_matmul_precision": precision}
    if not torch.cuda.is_available():
        off = logged and not found.tf32
        run.add("tf32", None, None if off else False, detail, "not applicable: no CUDA" if off else "TF32 without CUDA")
        return
    capability = tuple(torch.cuda.get_device_capability())
    detail["capability"] = capability
    if capability < (8, 0):
        off = logged and not found.tf32 and "no TF32" in logged[-1]
        run.add("tf32", None, None if off else False, detail, f"not applicable: capability {capability} < (8, 0)")
        return
    on = found.tf32 and any("TF32 matmuls enabled" in message for message in logged) and precision == "high"
    run.add("tf32", None, bool(on), detail)


def expected_auto_dtype() -> torch.dtype:
    """What `dtype: auto` must resolve to, read from the machine here (docs/gpu.md, docs/configuration.md):
    the process's CUDA device where it has one, as the handlers decide it."""
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16
    from ts_compiled_handlers.runtime.hardware import read_cpu_flags

    return torch.bfloat16 if read_cpu_flags() & {"amx_bf16", "avx512_bf16"} else torch.float32


def check_auto_dtype(run: Run, name: str, worker) -> None:
    expected, got = expected_auto_dtype(), worker.engine.dtype
    detail = {"expected": str(expected), "resolved": str(got)}
    run.add("auto dtype", name, got == expected, detail, "" if got == expected else f"resolved to {got}")


def reset_compiler() -> None:
    """A fresh dynamo (and CUDA graph trees) per worker, its counters from zero, as a worker process has."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def rerun_grid(worker) -> int:
    """Every warm-up shape once more after ready, with and without padding, as live calls reach them."""
    from ts_compiled_handlers.engine import buckets
    from ts_compiled_handlers.startup import warmup

    plan, filler, shapes = worker.engine.plan, worker.serving.probes.filler, buckets.warmup_shapes(worker.engine.plan)
    for batch, seq_len in shapes:
        previous = max([length for length in plan.seq_lens if length < seq_len], default=0)
        for token_ids in warmup.padding_variants(filler(seq_len, batch), seq_len - 1 > previous):
            worker.engine.run(token_ids, one_per_row=True)
    return len(shapes)


def cuda_graphs() -> dict:
    """CUDA graphs inductor skipped (its counter), and those recorded (torch's private graph trees;
    None where that API cannot be read)."""
    from torch._dynamo.utils import counters

    found = {"skipped": counters["inductor"]["cudagraph_skips"], "recorded": None}
    if not torch.cuda.is_available():
        return found
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
        nodes = [node for roots in manager.roots.values() for node in roots] if manager is not None else []
        recorded = 0
        while nodes:
            node = nodes.pop()
            recorded += 1
            nodes += [child for children in node.children.values() for child in children]
        found["recorded"] = recorded
    except Exception as error:  # a private API: its shape may change between torch releases
        found["recorded_unreadable"] = f"{type(error).__name__}: {error}"
    return found


def cuda_graphs_verdict(at_ready: dict, now: dict) -> tuple[bool, dict, str]:
    """reduce-overhead on CUDA: graphs recorded by warm-up and none skipped. Graphs recorded after
    ready (a capture during a request, for a shape warm-up did not run) are said, not failed: dynamo
    compiled nothing for them, which is what RecompilesAfterReady counts."""
    detail = {"skipped": now["skipped"], "recorded_at_ready": at_ready["recorded"], "recorded_at_end": now["recorded"]}
    detail.update({key: value for key, value in now.items() if key.endswith("unreadable")})
    passed = now["skipped"] == 0 and at_ready["recorded"] != 0
    later = (now["recorded"] or 0) - (at_ready["recorded"] or 0)
    return passed, detail, f"{later} CUDA graphs recorded after ready" if later else ""


def check_compiled(run: Run, name: str, mode: str, worker, graphs_at_ready: int, cuda_at_ready: dict) -> None:
    """Every bucket warmed, nothing compiled after ready; reduce-overhead: CUDA graphs, none skipped."""
    from ts_compiled_handlers.compiling.compiling import compiled_graph_count
    from ts_compiled_handlers.engine import buckets

    plan, model, report = worker.engine.plan, worker.engine.model, worker.started.report
    detail = {
        "model_source": worker.model_source,
        "grid": {"seq_lens": list(plan.seq_lens), "batch_sizes": list(plan.batch_sizes)},
        "shapes_warmed": report.shapes,
        "graphs_at_ready": graphs_at_ready,
        "graphs_after_traffic": compiled_graph_count(),
        "recompiles_after_ready": model.recompiles_after_ready,
        "compile_seconds": round(report.compile_seconds, 2),
    }
    grid_ok = detail["grid"] == run.profile.grid and report.shapes == len(buckets.warmup_shapes(plan))
    passed = model.is_compiled and grid_ok and model.recompiles_after_ready == 0
    passed = passed and detail["graphs_after_traffic"] == graphs_at_ready
    why = ""
    if mode == "reduce-overhead" and run.device.type == "cuda":
        graphs_passed, detail["cuda_graphs"], why = cuda_graphs_verdict(cuda_at_ready, cuda_graphs())
        passed = passed and graphs_passed
    elif mode == "reduce-overhead":
        detail["cuda_graphs"] = "none: CUDA graphs do not exist on the CPU; inductor runs reduce-overhead as default"
        why = "run as default: no CUDA graphs on the CPU"
    run.add(f"compile {mode}", name, bool(passed), detail, why)


def served_embeddings(worker, texts: list[str]) -> torch.Tensor:
    """The texts' embeddings as a client gets them: one request accepted, run and replied to."""
    from ts_compiled_handlers.worker.messages import Incoming

    accepted = worker.reader.accept(Incoming(json.dumps({"inputs": texts}).encode(), "application/json"))
    reply = worker.reply(accepted, worker.run([accepted])[0])
    return torch.tensor([row["embedding"] for row in json.loads(reply.body)])


def check_parity(run: Run, name: str, source: str, worker, texts: list[str], reference: torch.Tensor) -> None:
    served = served_embeddings(worker, texts)
    cosine = torch.nn.functional.cosine_similarity(served, reference, dim=-1)
    floor = 0.9999 if worker.engine.dtype == torch.float32 else 0.999
    detail = {"dtype": str(worker.engine.dtype), "min_cosine": cosine.min().item(), "floor": floor}
    precision = torch.get_float32_matmul_precision()
    detail["texts"], detail["reference"] = len(texts), f"sentence-transformers encode, float32 ({precision} matmuls)"
    run.add(f"parity {source}", name, cosine.min().item() >= floor, detail)


def parity_texts(grid: dict) -> list[str]:
    """Texts of every length bucket (a word is a token of the tiny vocabulary), the longest within the grid."""
    longest = grid["seq_lens"][-1] - 2  # [CLS] and [SEP]
    counts = sorted({max(1, count) for count in (1, 3, longest // 4, longest // 2, longest - 1, longest)})
    return [" ".join(WORDS[(start + i) % len(WORDS)] for i in range(count)) for start, count in enumerate(counts)]


def reference_embeddings(run: Run, model_dir: Path, texts: list[str]) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=str(run.device))
    return model.encode(texts, batch_size=len(texts), convert_to_tensor=True).float().cpu()


def texts_per_second(worker, shapes: tuple, warmup: int, iterations: int) -> dict:
    """(batch, seq_len) -> {eager, served: texts/s, noisy}, the two timed in turns."""
    from ts_compiled_handlers.benchmarks import measure
    from ts_compiled_handlers.engine.runner import EagerRunner

    engine = worker.engine
    eager = engine.on(EagerRunner(engine.model.eager))
    found = {}
    for batch, seq_len in shapes:
        ids = worker.serving.probes.filler(seq_len, batch)
        calls = {
            name: functools.partial(each.run, ids, one_per_row=True)
            for name, each in (("eager", eager), ("served", engine))
        }
        samples = measure.time_interleaved(calls, warmup, iterations, engine.device)
        summaries = {name: measure.summarize(values) for name, values in samples.items()}
        found[(batch, seq_len)] = {name: batch / summary["median"] for name, summary in summaries.items()}
        found[(batch, seq_len)]["noisy"] = any(summary["noisy"] for summary in summaries.values())
    return found


# -- the stages ------------------------------------------------------------------------------------
def compiled_stage(run: Run, name: str, model_dir: Path, mode: str, parity: tuple) -> dict:
    """One compile mode's worker: built, its checks, its texts/s."""
    from ts_compiled_handlers.compiling.compiling import compiled_graph_count
    from ts_compiled_handlers.tasks.embedding import EmbeddingTask
    from ts_compiled_handlers.worker.worker import Worker

    reset_compiler()
    worker = Worker.build(run.placement(model_dir, name, mode), EmbeddingTask)
    graphs_at_ready, cuda_at_ready = compiled_graph_count(), cuda_graphs()
    if mode == run.args.modes[0]:
        check_auto_dtype(run, name, worker)
    check_parity(run, name, mode, worker, *parity)
    rerun_grid(worker)
    timed = texts_per_second(worker, run.profile.shapes, run.profile.warmup, run.args.iterations)
    check_compiled(run, name, mode, worker, graphs_at_ready, cuda_at_ready)
    return timed


def aot_stage(run: Run, name: str, model_dir: Path, parity: tuple) -> dict:
    """An AOT package built into a copy of the model's folder, then a worker serving from it."""
    from ts_compiled_handlers.compiling.compiling import compiled_graph_count
    from ts_compiled_handlers.startup import aot_start, build_steps
    from ts_compiled_handlers.tasks.embedding import EmbeddingTask
    from ts_compiled_handlers.worker.worker import Worker

    target = run.scratch / "aot" / name
    shutil.copytree(model_dir, target)
    placement = run.placement(target, name, "default")
    reset_compiler()
    began = time.perf_counter()
    task, serving, _ = Worker.read(placement, EmbeddingTask)
    built = aot_start.build_package(task, serving, build_steps.eager_engine(task, serving))
    build_seconds = time.perf_counter() - began
    reset_compiler()
    worker = Worker.build(placement, EmbeddingTask)
    check_parity(run, name, "aot", worker, *parity)
    shapes = rerun_grid(worker)
    timed = texts_per_second(worker, run.profile.shapes, run.profile.warmup, run.args.iterations)
    detail = {
        "model_source": worker.model_source,
        "build_seconds": round(build_seconds, 1),
        "built": built,
        "shapes_run_after_ready": shapes,
        "recompiles_after_ready": worker.engine.model.recompiles_after_ready,
        "dynamo_graphs": compiled_graph_count(),
    }
    passed = worker.model_source == "aot package" and detail["recompiles_after_ready"] == 0
    run.add("aot package", name, passed and detail["dynamo_graphs"] == 0, detail)
    return timed


def make_model(run: Run, name: str) -> Path:
    """The model's random-weight folder in sentence-transformers' layout, seeded."""
    from ts_compiled_handlers.scripts.make_tiny_models import make_embedding

    torch.manual_seed(0)
    folder = run.scratch / "models" / name
    folder.mkdir(parents=True)
    return make_embedding(folder, run.profile.models[name])


def model_stages(run: Run, name: str, model_dir: Path) -> None:
    texts = parity_texts(run.profile.grid)
    reference = run.stage("reference", name, reference_embeddings, model_dir, texts)
    if reference is None:
        return
    timings = {}
    for mode in run.args.modes:
        timings[mode] = run.stage(f"compile {mode}", name, compiled_stage, name, model_dir, mode, (texts, reference))
    if name in run.args.aot_models:
        timings["aot"] = run.stage("aot package", name, aot_stage, name, model_dir, (texts, reference))
    run.result["rows"] += table_rows(name, {source: found for source, found in timings.items() if found})


def table_rows(name: str, timings: dict) -> list[dict]:
    """One row per shape: eager's texts/s (the first pass's), and each source's with its ratio to
    the eager texts/s timed in its own pass."""
    rows = []
    shapes = sorted({shape for found in timings.values() for shape in found})
    for batch, seq_len in shapes:
        passes = {source: found[(batch, seq_len)] for source, found in timings.items() if (batch, seq_len) in found}
        row = {"model": name, "batch": batch, "seq_len": seq_len, "eager": next(iter(passes.values()))["eager"]}
        for source, found in passes.items():
            row[source], row[f"{source}_x"] = found["served"], found["served"] / found["eager"]
        row["noisy"] = any(found["noisy"] for found in passes.values())
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    sources = [source for source in ("default", "reduce-overhead", "aot") if any(source in row for row in rows)]
    print("texts/s through the engine; x = against eager timed in turns in the same pass")
    print(f"{'model':<10}{'b x s':>9}{'eager':>10}" + "".join(f"{source:>17}{'x':>7}" for source in sources))
    for row in rows:
        line = f"{row['model']:<10}{row['batch']:>4} x {row['seq_len']:<3}{row['eager']:>10.1f}"
        for source in sources:
            line += f"{row[source]:>17.1f}{row[source + '_x']:>7.2f}" if source in row else f"{'-':>17}{'-':>7}"
        print(line + (" noisy" if row["noisy"] else ""))


def versions() -> dict:
    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import sentence_transformers

        found["sentence_transformers"] = sentence_transformers.__version__
    except ImportError:
        found["sentence_transformers"] = None
    found["cuda"] = torch.version.cuda
    found["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return found


def note_modes_left_out(run: Run) -> None:
    """On the CPU, reduce-overhead is left out unless asked for: it has no CUDA graphs there."""
    if run.device.type == "cpu" and "reduce-overhead" not in run.args.modes:
        why = "not applicable: CUDA graphs do not exist on the CPU (with --modes ... reduce-overhead: run as default)"
        run.add("compile reduce-overhead", None, None, {"cuda_graphs": "none on the CPU"}, why)


def check_no_torchserve(run: Run) -> None:
    imported = sorted(name for name in sys.modules if name == "ts" or name.startswith("ts."))
    run.add("no torchserve", None, not imported, {"ts_modules_imported": imported[:10]})


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry", action="store_true", help="on the CPU, one tiny model (hidden 32, 2 layers)")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu_check.json"), help="where the JSON goes")
    parser.add_argument(
        "--models", nargs="+", help="models to check (default: the profile's: bert-base minilm; dry: tiny)"
    )
    parser.add_argument(
        "--aot-models", nargs="*", help="models to build an AOT package of (default: minilm; dry: tiny)"
    )
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        help="torch.compile modes to check (default: both; dry: default, since the CPU has no CUDA graphs)",
    )
    parser.add_argument("--iterations", type=int, help="timed calls per contender and shape (default 20; dry: 3)")
    parser.add_argument("--log-level", default="WARNING", help="the handlers' log level on stderr (INFO: every line)")
    args = parser.parse_args(argv)
    profile = DRY if args.dry else GPU
    args.models = args.models or list(profile.models)
    args.aot_models = profile.aot_models if args.aot_models is None else args.aot_models
    args.iterations = args.iterations or profile.iterations
    args.modes = args.modes or (["default"] if args.dry else list(MODES))
    unknown = sorted(set(args.models + list(args.aot_models)) - set(profile.models))
    if unknown:
        parser.error(f"no model {unknown} in this profile; choose from {sorted(profile.models)}")
    if not args.dry and not torch.cuda.is_available():
        parser.error("no CUDA device here: --dry runs the same code on the CPU")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    lines, when = listen_to_hardware()  # before any handler module runs detect() at import
    profile = DRY if args.dry else GPU
    device = torch.device("cpu" if args.dry else f"cuda:{torch.cuda.current_device()}")
    result = {"dry": args.dry, "versions": versions(), "profile": dataclasses.asdict(profile), "checks": []}
    result.update({"rows": [], "seconds": {}, "running": None, "finished": False})
    with tempfile.TemporaryDirectory() as scratch:
        run = Run(args, profile, Path(scratch), device, result)
        check_tf32(run, lines, when)
        note_modes_left_out(run)
        for name in args.models:
            model_dir = run.stage("make model", name, make_model, name)
            if model_dir is not None:
                model_stages(run, name, model_dir)
        check_no_torchserve(run)
        result["finished"] = True
        run.save()
    print_table(result["rows"])
    failed = [f"{check['check']} ({check['model']})" for check in result["checks"] if check["status"] == "failed"]
    print(f"{'PASSED' if result['passed'] else 'FAILED: ' + ', '.join(failed)} in {result['seconds']['total']:.0f} s")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
