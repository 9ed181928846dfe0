"""Build a self-contained .mar: model files, tokenizer, our package's serving code, model-config.yaml.

    hfserve build --model DIR --task embedding --model-name minilm [--config extra.yaml] [--plan plan.json]
                  [--precompile [aot|cache]] [--version 2.0] [--export-path DIR] [--force] [--handler my_handler.py]

The archive registers on any TorchServe whose Python has torch and transformers. Model folders
without safetensors weights, or whose config asks for remote code, are refused.

`--precompile` compiles at build time in a fresh process set up like a worker (precompile.py here)
and packs the result into the archive with a manifest of what it is valid for; workers on a matching
host load it instead of compiling. `aot` (the default where the task exports: every task but
generation) is an AOTInductor package, which a worker loads without dynamo; `cache` is inductor's
compile cache, which saves the kernels but not dynamo's tracing. The build writes a
`startupTimeout` with a margin into model-config.yaml that fits a worker that has to compile anyway
(another host, a mismatched package): measured with `--precompile cache`, estimated from the grid
and the model's depth otherwise.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml
from transformers import AutoConfig, AutoTokenizer

from ts_compiled_handlers.configuration.config import TASKS, ConfigError, parse
from ts_compiled_handlers.graphs import lora
from ts_compiled_handlers.quantizing.calibration import CalibrationError, calibration_texts
from ts_compiled_handlers.runtime import package_files
from ts_compiled_handlers.scripts import answer_ranges, hub, precompile
from ts_compiled_handlers.scripts.cli import HelpFormatter, UserError
from ts_compiled_handlers.scripts.task_inference import AmbiguousTask, infer_task
from ts_compiled_handlers.servers.torchserve import settings
from ts_compiled_handlers.startup import start_cost, warmup
from ts_compiled_handlers.startup.bucket_plan import task_plan
from ts_compiled_handlers.tasks.registry import task_class

# batchSize 32: requests arriving at a rate were answered as fast or faster than with 8 at every
# rate, and past 8's capacity (docs/performance.md, "batchSize and maxBatchDelay", open loop).
# maxBatchDelay 5: 1 answers a lone query 2-6 ms sooner but served less under load in most rounds
# (docs/performance.md, "Against vLLM's CPU build"); never 0, which caps every batch at 2 (TorchServe
# 0.12's pollBatch stops once the delay left is at or below 0, after its second request).
DEFAULT_MODEL_CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 32,
    "maxBatchDelay": 5,
    "responseTimeout": 120,
}
# Per task, over DEFAULT_MODEL_CONFIG: generation runs continuous batching (handlers/loops/decode_loop.py;
# `continuousBatching: false` in --config gives request batches, where a call is a whole decode loop),
# its batch the decode loop's slots, the largest batch bucket (8).
TASK_MODEL_CONFIG = {"text-generation": {"responseTimeout": 300, "continuousBatching": True, "batchSize": 8}}
# With `asyncCommunication: true` in --config, an encoder task schedules by tokens in the worker
# (handlers/loops/token_scheduler.py): the frontend hands each request over as it comes, one at a time (TorchServe
# 0.12's async frontend fails on two in one message: parse refuses another batchSize).
ASYNC_MODEL_CONFIG = {"batchSize": 1}
# What serving reads from a model folder; anything else a Hub snapshot holds (ONNX, OpenVINO, TF,
# Flax, pickle weights, READMEs, training files) stays out of the archive.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.model",  # sentencepiece vocabularies
    "chat_template.jinja",
    "chat_template.json",
    "modules.json",  # sentence-transformers: its modules, their settings, the length limit
    "config_sentence_transformers.json",
    "sentence_bert_config.json",
    "colbert_linear.pt",  # bge-m3's heads: PyTorch files, read with weights_only=True (handlers/tasks/m3.py)
    "sparse_linear.pt",
    "preprocessor_config.json",  # an image processor's settings (CLIP: resize, crop, normalize)
    "processor_config.json",  # the same, inside the processor's, as sentence-transformers saves a CLIP
)
# startupTimeout = MARGIN x (compile + warm-up) + what a worker spends before it (interpreter, imports,
# model load), never under TorchServe's own default.
STARTUP_MARGIN = 2.0
STARTUP_FIXED_SECONDS = 30
STARTUP_FLOOR_SECONDS = 120


CALIBRATION_FILE = "calibration.txt"  # `--calibration FILE` in the archive (handler.calibration names it)


class BuildError(ValueError):
    pass


def check_model_dir(model_dir: Path) -> None:
    """Refuse what the handler must never load: pickle-only weights, remote code."""
    if not (model_dir / "config.json").is_file():
        raise BuildError(f"{model_dir} has no config.json: pass the folder save_pretrained wrote")
    if not list(model_dir.glob("*.safetensors")):
        pickles = [p.name for p in model_dir.glob("*.bin")] + [p.name for p in model_dir.glob("*.pt*")]
        raise BuildError(
            f"{model_dir} has no .safetensors weights (found {pickles or 'none'}); pickle weights can run code "
            "when loaded: convert with model.save_pretrained(dir, safe_serialization=True)"
        )
    config = json.loads((model_dir / "config.json").read_text())
    if "auto_map" in config:
        raise BuildError(
            f"{model_dir}/config.json asks for remote code (auto_map); only built-in architectures are served"
        )


def merge(base: dict, extra: dict) -> dict:
    """`extra` over `base`, recursively for nested mappings."""
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return merged


def model_config(task: str, extra: dict) -> dict:
    """The model-config.yaml for the archive, validated now rather than at registration."""
    scheduled = extra.get("asyncCommunication") is True
    own = TASK_MODEL_CONFIG.get(task, ASYNC_MODEL_CONFIG if scheduled else {})
    defaults = {**DEFAULT_MODEL_CONFIG, **own, "handler": {"task": task}}
    config = merge(defaults, extra)
    if config["handler"].get("task") != task:
        raise BuildError(f"--task {task} but the config says handler.task={config['handler'].get('task')}")
    settings.read(config, parse(config).task)
    return config


def unfrozen_for_cache(config: dict, kind: str | None) -> dict:
    """An archive that ships a compile cache compiles its graphs unfrozen: inductor caches no graph
    whose weights it froze and prepacked (oneDNN's packed tensors do not pickle), so there
    `compile.freezing` is false unless the config says otherwise, and true is refused."""
    if kind != "cache":
        return config
    if config["handler"].get("compile", {}).get("freezing") is True:
        raise BuildError("--precompile cache with compile.freezing: true: inductor caches no frozen graph")
    if config["handler"].get("quantize", "none") != "none":  # oneDNN's int8 kernels come with freezing only
        raise BuildError("--precompile cache with --quantize: int8 runs unfrozen there, slower; use --precompile aot")
    return merge(config, {"handler": {"compile": {"freezing": False}}})


def estimated_compile_seconds(config: dict, model_dir: Path) -> float:
    """Compile + warm-up + the start's checks, planned from the grid and the model's FLOPs without
    running it (handlers/startup/start_cost.py), at the rates this host measures."""
    handler = parse(config)
    plan = task_plan(task_class(handler.task)(handler), handler, Path(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    model_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    probe = warmup.Probes(tokenizer, plan).check_rows()
    try:
        return start_cost.planned(handler, Path(model_dir), plan, probe, model_config).seconds
    except start_cost.UNPLANNED as error:
        why = f"{type(error).__name__}: {error}"
        print(f"build_mar: WARNING: the start's passes not planned ({why}); compiling alone counted", file=sys.stderr)
        return start_cost.compile_seconds(handler, plan, model_config)


def startup_timeout(config: dict, compile_seconds: float, measured: bool) -> dict:
    """`config` with a startupTimeout that fits the compile; a user's smaller value is kept, with a warning."""
    needed = STARTUP_MARGIN * compile_seconds + STARTUP_FIXED_SECONDS
    needed = max(STARTUP_FLOOR_SECONDS, 10 * math.ceil(needed / 10))
    how = "measured" if measured else "estimated"
    given = config.get("startupTimeout")
    if given is None:
        print(f"build_mar: startupTimeout {needed} s (compile + warm-up {how} at {compile_seconds:.0f} s)")
        return {**config, "startupTimeout": needed}
    if given < needed:
        print(
            f"build_mar: WARNING: the grid is too large for startupTimeout={given}: compile + warm-up {how} at "
            f"{compile_seconds:.0f} s needs about {needed} s; shrink the grid, use compile.regional or "
            "--precompile, or raise startupTimeout",
            file=sys.stderr,
        )
    return config


def check_adapters(adapters: dict[str, Path], kind: str | None) -> None:
    """Each adapter folder one the worker can serve (its shapes are matched to the model at start)."""
    if kind == "aot":
        raise BuildError("--adapter: adapters are served compiled, not from an AOT package; use --precompile cache")
    for name, folder in adapters.items():
        try:
            lora.read_adapter(name, Path(folder))
        except (lora.AdapterError, OSError, ValueError, KeyError) as error:
            raise BuildError(f"--adapter {name}={folder}: {error}") from error


def precompile_kind(task: str, asked: str | bool | None) -> str | None:
    """`aot` or `cache` (or None: no precompiling) for what `--precompile` asked of this task."""
    if asked in (None, False):
        return None
    if asked in (True, "auto"):
        return "aot" if task_class(task).AOT else "cache"
    if asked == "aot" and not task_class(task).AOT:
        raise BuildError(f"--precompile aot: {task} is not exported ahead of time; use --precompile cache")
    return asked


def run_precompile(staging: Path, handler: Path, kind: str) -> dict:
    """Compile in a fresh process set up like a worker; it writes staging/aot_package or compile_cache."""
    with tempfile.TemporaryDirectory() as temp:
        result = Path(temp) / "result.json"
        relative = str(handler.relative_to(staging))
        command = [sys.executable, "-m", precompile.__name__, str(staging), str(result), relative, kind]
        subprocess.run(command, check=True, cwd=temp)
        return json.loads(result.read_text())


def serving_files(model_dir: Path) -> list[Path]:
    """The files of `model_dir` that serving reads: MODEL_FILES, and the settings and safetensors
    weights of its sentence-transformers modules (1_Pooling/config.json, a ColBERT's 1_Dense)."""
    files = {path for pattern in MODEL_FILES for path in model_dir.glob(pattern) if path.is_file()}
    modules = json.loads((model_dir / "modules.json").read_text()) if (model_dir / "modules.json").is_file() else []
    for module in modules:
        folder = model_dir / module.get("path", "")
        if module.get("path") and folder.is_dir():
            files.update(path for pattern in ("*.json", "*.safetensors") for path in folder.glob(pattern))
    return sorted(files)


def stage(model_dir: Path, config: dict, staging: Path, adapters: dict[str, Path] | None = None) -> list[Path]:
    """Model files, adapters and our package's serving files side by side, as they will sit in the
    archive root; returns what of `model_dir` was left out."""
    for name, folder in (adapters or {}).items():
        (staging / lora.FOLDER / name).mkdir(parents=True, exist_ok=True)
        for file in (lora.CONFIG_FILE, lora.WEIGHTS_FILE):
            shutil.copy2(Path(folder) / file, staging / lora.FOLDER / name / file)
    kept = serving_files(model_dir)
    for path in kept:
        target = staging / path.relative_to(model_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    for path in package_files.serving_files():
        (staging / package_files.NAME / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(package_files.PACKAGE / path, staging / package_files.NAME / path)
    write_model_config(config, staging)
    every = [path for path in model_dir.rglob("*") if path.is_file() and ".git" not in path.parts]
    return sorted(set(every) - set(kept))


def describe_archive(archive_path: Path, left_out: list[Path], model_dir: Path) -> str:
    """The archive's size and contents (our package in one line), and what was left out."""
    ours = f"{package_files.NAME}/"
    with zipfile.ZipFile(archive_path) as mar:
        entries = [(info.filename, info.file_size) for info in mar.infolist() if not info.is_dir()]
    code = [(name, size) for name, size in entries if name.startswith(ours)]
    lines = [f"{archive_path} ({archive_path.stat().st_size / 1e6:.1f} MB):"]
    lines += [f"  {size / 1e6:9.3f} MB  {name}" for name, size in entries if not name.startswith(ours)]
    lines.append(f"  {sum(size for _, size in code) / 1e6:9.3f} MB  {ours} ({len(code)} files: our handler package)")
    if left_out:
        names = ", ".join(str(path.relative_to(model_dir)) for path in left_out[:12])
        more = f" and {len(left_out) - 12} more" if len(left_out) > 12 else ""
        lines.append(f"  left out of {model_dir} (serving does not read them): {names}{more}")
    return "\n".join(lines)


def write_model_config(config: dict, staging: Path) -> None:
    (staging / "model-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def archive(staging: Path, name: str, handler: Path, export_path: Path, version: str = "1.0") -> Path:
    """Pack a staged folder (model-config.yaml included) into `export_path/name.mar`. The archiver
    writes in place, so it writes into a hidden folder beside the target, renamed over it once whole:
    a build cut short (Ctrl-C, a full disk) leaves the previous NAME.mar or none, never a partial one."""
    export_path = Path(export_path)
    export_path.mkdir(parents=True, exist_ok=True)
    target = export_path / f"{name}.mar"
    with tempfile.TemporaryDirectory() as temp, tempfile.TemporaryDirectory(prefix=f".{name}-", dir=export_path) as out:
        command = [
            str(Path(sys.executable).parent / "torch-model-archiver"),
            *("--model-name", name, "--version", version),
            *("--handler", str(handler)),
            *("--extra-files", str(staging)),
            *("--config-file", str(staging / "model-config.yaml")),
            *("--export-path", out, "--force"),
        ]
        # The archiver stages in $TMPDIR/<name> after deleting it: give it a private TMPDIR.
        subprocess.run(command, check=True, env={**os.environ, "TMPDIR": temp})
        os.replace(Path(out) / target.name, target)
    return target


def build(
    model_dir: Path,
    task: str,
    name: str,
    export_path: Path,
    extra_config: dict | None = None,
    handler_file: Path | None = None,
    precompile: str | bool | None = None,
    version: str = "1.0",
    calibration: Path | None = None,
    adapters: dict[str, Path] | None = None,
) -> Path:
    """The .mar of `model_dir` served by the task's handler (or `handler_file`, a subclass of it);
    `precompile`: "aot", "cache", True (the task's default kind) or None; `calibration`: a file of
    texts for the int8 gate and an embedder's answer ranges, carried in the archive as CALIBRATION_FILE;
    `adapters`: LoRA adapters (PEFT's folders) by name, carried under adapters/NAME/."""
    model_dir = Path(model_dir)
    check_model_dir(model_dir)
    kind = precompile_kind(task, precompile)
    extra_config = extra_config or {}
    if adapters:
        extra_config = merge(extra_config, {"handler": {"adapters": list(adapters)}})
        check_adapters(adapters, kind)  # their files: copied by `stage`
    if calibration is not None:
        check_calibration(calibration)
        extra_config = merge(extra_config, {"handler": {"calibration": CALIBRATION_FILE}})
    config = unfrozen_for_cache(model_config(task, extra_config), kind)
    with tempfile.TemporaryDirectory() as temp:
        staging = Path(temp)
        left_out = stage(model_dir, config, staging, adapters)
        if calibration is not None:
            shutil.copy2(calibration, staging / CALIBRATION_FILE)
        check_staged_calibration(parse(config).calibration, staging)
        if task == "embedding":  # int8/uint8 answers' ranges (handlers/tasks/precisions.py)
            answer_ranges.write_ranges(staging, parse(config))
        handler = staging / package_files.NAME / package_files.HANDLER
        if handler_file is not None:
            handler = staging / Path(handler_file).name
            shutil.copy2(handler_file, handler)
        if kind == "cache":
            seconds = run_precompile(staging, handler, kind)["initialize_seconds"]
        else:  # a worker that cannot use the AOT package compiles, and must fit in startupTimeout too
            if kind == "aot":
                run_precompile(staging, handler, kind)
            seconds = estimated_compile_seconds(config, model_dir)
        write_model_config(startup_timeout(config, seconds, measured=kind == "cache"), staging)
        built = archive(staging, name, handler, export_path, version)
    print(describe_archive(built, left_out, model_dir))
    return built


def check_calibration(path: Path) -> None:
    """A calibration file the worker will read: refused now, not at the worker's start (by its
    absolute path: a file named `default` is a file, not the shipped set)."""
    try:
        calibration_texts(str(Path(path).resolve()), Path("."))
    except CalibrationError as error:
        raise BuildError(str(error).replace("handler.calibration: ", "--calibration: ")) from error


def check_staged_calibration(setting: str, staging: Path) -> None:
    """The archive's `handler.calibration` (named by --config too) readable inside the staged archive:
    a file the model's folder does not carry into it would fail every worker at its start."""
    if setting == "default":
        return
    try:
        calibration_texts(setting, staging)
    except CalibrationError as error:
        raise BuildError(f"{error} (give the file with --calibration FILE: it is carried into the archive)") from error


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument(
        "--model",
        required=True,
        help="a model folder (save_pretrained output) or a Hugging Face Hub id, found in the local cache",
    )
    parser.add_argument("--revision", help="with a Hub id: the branch, tag or commit (default: main)")
    parser.add_argument(
        "--allow-download", action="store_true", help="with a Hub id: fetch it from the Hub if it is not cached"
    )
    parser.add_argument(
        "--task",
        choices=TASKS,
        help="which handler serves the model (default: read from the model's own files, scripts/task_inference.py)",
    )
    parser.add_argument("--model-name", "--name", dest="name", required=True, help="the archive is NAME.mar")
    parser.add_argument(
        "--config",
        type=Path,
        help="YAML merged over our default model-config.yaml (torch-model-archiver's --config-file replaces it)",
    )
    parser.add_argument("--plan", type=Path, help="length buckets chosen by `hfserve plan` (JSON)")
    parser.add_argument(
        "--precompile",
        nargs="?",
        const="auto",
        choices=("auto", "aot", "cache"),
        help="compile now and pack it into the .mar: an AOT package (auto: every task but generation) or the cache",
    )
    parser.add_argument("--version", default="1.0", help="model version (register several, then set-default)")
    parser.add_argument("--export-path", type=Path, default=Path("model_store"), help="where the .mar goes")
    parser.add_argument("--force", action="store_true", help="overwrite an existing NAME.mar in --export-path")
    parser.add_argument(
        "--handler", type=Path, help="your subclass of the task's handler (one class in its own file) to serve instead"
    )
    parser.add_argument(
        "--quantize", choices=("none", "int8", "int8-all", "auto"), help="handler.quantize (experimental int8)"
    )
    parser.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="a LoRA adapter PEFT saved (adapter_config.json, adapter_model.safetensors), served when a request "
        "names NAME; repeat for more",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        help="texts, one a line (a reranker's may be `query<TAB>document`), for the int8 gate and an embedder's "
        "int8/uint8 answer ranges (default: a shipped set)",
    )
    args = parser.parse_args(argv)
    target = args.export_path / f"{args.name}.mar"
    if target.exists() and not args.force:
        raise UserError(f"{target} exists; pass --force to overwrite it, or another --model-name")
    extra = read_config(args.config) if args.config else {}
    if args.quantize:
        extra = merge(extra, {"handler": {"quantize": args.quantize}})
    if args.plan:
        planned = json.loads(args.plan.read_text())
        chosen = {key: planned[key] for key in ("seq_lens", "pack_tokens") if key in planned}
        extra = merge(extra, {"handler": {"buckets": chosen}})
    try:
        model_dir = hub.resolve(args.model, args.revision, args.allow_download)
        archive = build(
            model_dir,
            args.task or (extra.get("handler") or {}).get("task") or inferred_task(model_dir),
            args.name,
            args.export_path,
            extra,
            handler_file=args.handler,
            precompile=args.precompile,
            version=args.version,
            calibration=args.calibration,
            adapters=adapter_folders(args.adapter),
        )
    except (BuildError, ConfigError, hub.HubError, AmbiguousTask) as error:  # ConfigError: the config's own check
        raise UserError(str(error)) from error
    return archive


def adapter_folders(given: list[str]) -> dict[str, Path]:
    """`--adapter NAME=DIR` flags as {NAME: DIR}, in order."""
    folders = {}
    for flag in given:
        name, _, folder = flag.partition("=")
        if not name or not folder or name in folders:
            raise UserError(f"--adapter {flag}: give NAME=DIR, each NAME once")
        folders[name] = Path(folder)
    return folders


def inferred_task(model_dir: Path) -> str:
    task = infer_task(model_dir)
    print(f"task: {task}, read from the model's files (--task chooses another)")
    return task


def read_config(path: Path) -> dict:
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise UserError(f"{path} is not valid YAML: {' '.join(str(error).split())}") from error
    if not isinstance(config, dict):
        raise UserError(f"{path} must hold a YAML mapping (model-config.yaml keys), not {type(config).__name__}")
    return config


if __name__ == "__main__":
    from ts_compiled_handlers.scripts.cli import main as hfserve

    hfserve(["build", *sys.argv[1:]])
