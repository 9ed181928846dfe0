"""`hfserve serve MODEL`: one command from a model to a warm server, as TEI's router and `vllm serve` are.

    hfserve serve ./my-model --name mine --port 8080      # or a Hub id from the local cache
    hfserve serve BAAI/bge-small-en-v1.5 --dtype float32 --max-client-batch-size 64

It builds `model_store/NAME.mar` unless an archive built from the same model files (by content),
options and release is there, unchanged since (then it is reused, and with it this host's compile
cache), starts TorchServe,
registers the archive, waits until its worker is warm, and prints one ready line with the URLs
and the key file. It stays in the foreground: SIGINT or SIGTERM stops TorchServe and exits 0.
Everything it writes is under the folder it runs in: model_store/ and runs/serve-NAME/ (the
server's config, logs and key_file.json). TorchServe's keys expire after its token_expiration_min
(60 minutes): clients re-read key_file.json, as `hfserve` does (docs/coming-from.md).

Flags carry TEI's and vLLM's names where they mean the same; `--config` takes the rest (a
model-config.yaml, merged under them).
"""

import argparse
import hashlib
import json
import signal
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ts_compiled_handlers.compiling.compile_cache import file_digest
from ts_compiled_handlers.configuration.config import ConfigError
from ts_compiled_handlers.scripts import build_mar, hub
from ts_compiled_handlers.scripts.cli import HelpFormatter, UserError
from ts_compiled_handlers.scripts.serve import TEMPLATE, TorchServe, busy, free_ports
from ts_compiled_handlers.scripts.task_inference import TASKS, AmbiguousTask


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="hfserve serve", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("model", help="a model folder (save_pretrained output) or a Hub id in the local cache")
    parser.add_argument("--name", "--model-name", dest="name", help="the archive's name (default: the model's)")
    parser.add_argument("--port", type=int, default=8080, help="inference; management and metrics take the next two")
    parser.add_argument("--management-port", type=int, help="default: --port + 1 (always on loopback)")
    parser.add_argument("--metrics-port", type=int, help="default: --port + 2")
    parser.add_argument("--hostname", default="127.0.0.1", help="the inference API's address")
    parser.add_argument(
        "--metrics-hostname",
        default="127.0.0.1",
        help="the metrics API's address: it asks no key, so --hostname never moves it",
    )
    parser.add_argument("--task", choices=TASKS, help="default: read from the model's own files")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), help="handler.dtype")
    parser.add_argument("--revision", help="with a Hub id: the branch, tag or commit")
    parser.add_argument("--max-batch-tokens", type=int, help="most tokens per model call (buckets.max_tokens)")
    parser.add_argument("--max-client-batch-size", type=int, help="the most texts one request may send (max_inputs)")
    parser.add_argument(
        "--auto-truncate",
        action=argparse.BooleanOptionalAction,
        help="cut texts over the longest bucket (default), or refuse them with 413 (--no-auto-truncate)",
    )
    parser.add_argument(
        "--quantize", choices=("none", "int8", "int8-all", "auto"), help="handler.quantize (experimental int8)"
    )
    parser.add_argument("--config", type=Path, help="model-config.yaml keys for the rest, merged under these flags")
    return parser.parse_args(argv)


def handler_settings(args) -> dict:
    """The flags as model-config.yaml's handler keys (only those given)."""
    settings = {}
    if args.dtype:
        settings["dtype"] = args.dtype
    if args.max_batch_tokens:
        settings["buckets"] = {"max_tokens": args.max_batch_tokens}
    if args.auto_truncate is not None:
        settings.setdefault("buckets", {})["overflow"] = "truncate" if args.auto_truncate else "reject"
    if args.max_client_batch_size:
        settings["max_inputs"] = args.max_client_batch_size
    if args.quantize:
        settings["quantize"] = args.quantize
    return settings


def fingerprint(model_dir: Path, task: str, config: dict, content: bool = True) -> str:
    """What the archive is built from: the model's files (their sha256; with `content=False` their
    sizes and mtimes, a fast first check), task, config and release."""
    try:
        release = version("ts-compiled-handlers")
    except PackageNotFoundError:
        release = "unknown"
    files = sorted(
        (str(path.relative_to(model_dir)), file_print(path, content)) for path in model_dir.rglob("*") if path.is_file()
    )
    made_from = {"model": str(model_dir.resolve()), "files": files, "task": task, "config": config, "release": release}
    return hashlib.sha256(json.dumps(made_from, sort_keys=True).encode()).hexdigest()


def file_print(path: Path, content: bool = True) -> str | list[int]:
    """A file's sha256, or (`content=False`, the fast first check) its size and mtime."""
    if content:
        return file_digest(path)
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


CHECKS = ("quick", "content")  # sizes and mtimes first: nothing is read when they differ


def archive(model_dir: Path, task: str, name: str, config: dict, store: Path) -> Path:
    """model_store/NAME.mar, built unless the one there was built from the same things. The record
    (NAME.built-from) goes before a build and comes back after it: an archive cut short is never reused."""
    target, record = store / f"{name}.mar", store / f"{name}.built-from"
    if reusable(target, record, model_dir, task, config):
        print(f"reusing {target} (built from the same model files, options and release)")
        return target
    record.unlink(missing_ok=True)
    target.unlink(missing_ok=True)
    model = {check: fingerprint(model_dir, task, config, check == "content") for check in CHECKS}
    built = build_mar.build(model_dir, task, name, store, config)
    record.write_text(json.dumps({check: [model[check], file_print(built, check == "content")] for check in CHECKS}))
    return built


def reusable(target: Path, record: Path, model_dir: Path, task: str, config: dict) -> bool:
    """Whether `target` is the archive its record describes, built from these model files, task,
    config and release; by content in the end (a file rewritten in place may keep its size and mtime)."""
    try:
        recorded = json.loads(record.read_text())
        for check in CHECKS:
            content = check == "content"
            if recorded[check] != [fingerprint(model_dir, task, config, content), file_print(target, content)]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError):  # no record or archive, or a record of another format
        return False


def listeners(args) -> dict[str, str]:
    """Where TorchServe listens: the key-less metrics API apart from --hostname, on loopback unless asked."""
    return {"bind": args.hostname, "metrics_bind": args.metrics_hostname}


def ports_from(args) -> dict[str, int]:
    ports = {
        "INFERENCE_PORT": args.port,
        "MANAGEMENT_PORT": args.management_port or args.port + 1,
        "METRICS_PORT": args.metrics_port or args.port + 2,
    }
    for key, port in ports.items():
        if busy(port):
            raise UserError(f"port {port} ({key.split('_')[0].lower()}) is in use: pass another --port")
    grpc = free_ports(2)
    return {**ports, "GRPC_INFERENCE_PORT": grpc[0], "GRPC_MANAGEMENT_PORT": grpc[1]}


def main(argv=None) -> None:
    args = parse_args(argv)
    name = args.name or Path(args.model.rstrip("/")).name  # a Hub id's last part, not its cache folder
    ports = ports_from(args)
    extra = build_mar.read_config(args.config) if args.config else {}
    extra = build_mar.merge(extra, {"handler": handler_settings(args)})
    try:
        model_dir = hub.resolve(args.model, args.revision)
        task = args.task or (extra.get("handler") or {}).get("task") or build_mar.inferred_task(model_dir)
        built = archive(model_dir, task, name, extra, Path("model_store"))
    except (build_mar.BuildError, ConfigError, hub.HubError, AmbiguousTask) as error:
        raise UserError(str(error)) from error
    server = TorchServe(Path("runs") / f"serve-{name}", built.parent, ports)
    stop, serving = threading.Event(), threading.Event()

    def on_signal(*_):
        stop.set()
        if not serving.is_set():
            raise Stopped  # out of the start or the registration's wait, at once

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    try:
        server.start(base_config=TEMPLATE, **listeners(args))
        server.register(built.name)
        serving.set()
        url = f"http://{args.hostname}:{args.port}/predictions/{name}"
        print(
            f"ready: {url} (OpenAI base URL {url}/1.0/v1, TEI base URL {url}/1.0); "
            f"the key: inference in {server.key_file()}",
            flush=True,
        )
        while not stop.wait(1):
            if not alive(server):
                raise UserError(f"TorchServe stopped on its own; see {server.workdir / 'logs'}")
    except Stopped:
        pass
    finally:
        serving.set()  # a second signal while stopping waits for the stop
        if (server.workdir / "tmp" / ".model_server.pid").is_file():  # started (TorchServe's own record)
            server.run("--stop", "--foreground")  # TorchServe's stop, waiting until its frontend has ended
    print("stopped")


class Stopped(Exception):
    """SIGINT or SIGTERM before the model was ready."""


def alive(server: TorchServe) -> bool:
    try:
        server.ping()
        return True
    except (OSError, ValueError):  # refused (requests' errors are OSErrors), or the key file half-written
        return False
