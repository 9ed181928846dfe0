"""Where a served request's CPU goes, by component: one worker through a real TorchServe, sampled.

One archive (MiniLM; `--async`: the token scheduler) on one server, driven by 16 then 32
closed-loop clients on the load test's long-tailed traffic. During each load py-spy samples the
worker's Python threads (idle ones left out) and /proc counts the CPU of the frontend and the
worker. Each sample is put in the first component, in COMPONENTS' order, that a frame of its stack
belongs to; a component's CPU per request is its samples over the sampling rate, over the requests
answered. The model's share is the rest of the worker's CPU: its intra-op threads are native
threads, which py-spy does not see, and the Python thread waiting on them is counted as the model.
py-spy counts a thread runnable but waiting for a core as busy, so where perf may record, the
worker's CPU is also split by perf's samples of its threads while they run (benchmarks/on_cpu.py):
that split, not py-spy's, is the CPU outside the model. With `--against REVISION` the archive
that revision's code builds (benchmarks/at_revision.py) is registered beside this tree's on the
same server, and the two are driven in turn, load by load, `--rounds` times; each figure is the
median of its rounds. Every archive takes the same `--batch-size` (8 unless told). With
`--allocators` there is a server per allocator (handlers/runtime/allocator.py), this tree's archive on
each and the `--against` archive on the first.

    python benchmarks/profile_worker.py                  # MiniLM, request batches, 30 s per load
    python benchmarks/profile_worker.py --async          # MiniLM, the token scheduler
    python benchmarks/profile_worker.py --torchserve-logging   # the frontend logging as TorchServe ships it
    python benchmarks/profile_worker.py --against 9221d4a --rounds 3   # and that revision's archive, interleaved
    python benchmarks/profile_worker.py --allocators system auto --against 9221d4a   # glibc's and tcmalloc
    python benchmarks/profile_worker.py --quick          # tiny model, 3 s per load (a smoke run)

Needs py-spy (`pip install py-spy`) and the right to trace the worker (root, or ptrace_scope 0);
perf (`apt-get install linux-perf`) for the on-CPU split, which is left out without it.
Prints a table and writes runs/profile_worker.json.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ts_compiled_handlers.benchmarks import at_revision, cpu, loadtest, measure, on_cpu
from ts_compiled_handlers.benchmarks.traffic import texts_of_lengths, traffic_lengths
from ts_compiled_handlers.runtime import allocator
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.cli import HelpFormatter, UserError
from ts_compiled_handlers.scripts.serve import TEMPLATE, TorchServe

# Which component a frame of ours or TorchServe's belongs to, first match wins. A sample goes to
# the frame nearest its leaf that one of these names (library frames below it, json or torch, are
# that frame's work), except that time in the logging module is logging's unless a metric is
# being written (TorchServe's metrics are log lines).
COMPONENTS = (
    # the compiled graph's own frames first: they run under packing.py's PackedModel.forward
    (
        "model call",
        (
            "torch/_inductor/",
            "torch/_dynamo/",
            "torch/nn/modules/",
            "model_runner.py",
            "compiling.py",
            "aot_package.py",
        ),
    ),
    ("metrics", ("ts_metrics.py", "ts/metrics/", "ts_compiled_handlers/runtime/metrics.py", "length_stats.py")),
    ("tokenization", ("tokenizing.py",)),
    ("layout and inputs", ("layout.py", "packing.py", "buckets.py", "engine.py")),
    ("answers", ("/tasks/", "labels.py", "entities.py", "pooling.py", "Protocol.encode (", "ranked (")),
    ("JSON", ("as_json (",)),
    ("body decoding", ("payload.py", "/protocols/", "RequestReader.accept (")),
    ("TorchServe messages", ("ts/protocol/", "ts/model_service_worker.py", "ts/service.py", "ts/async_service.py")),
    ("other (ours)", ("ts_compiled_handlers/",)),  # the loops, the worker's bookkeeping
)
LOGGING = "logging"
OTHER = "other (Python, no frame of ours or TorchServe's)"


def component_of(stack: str) -> str:
    """The component of one sampled stack (py-spy's raw format: frames root first, `;` apart)."""
    logged = False
    for frame in reversed(stack.split(";")):
        logged = logged or "logging/" in frame
        for name, marks in COMPONENTS:
            if any(mark in frame for mark in marks):
                return LOGGING if logged and name != "metrics" else name
    return LOGGING if logged else OTHER


def read_samples(raw: str) -> Counter:
    """Samples per component from py-spy's raw output (`stack count` per line)."""
    found = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            found[component_of(stack)] += int(count)
    return found


def py_spy() -> str | None:
    """py-spy beside this Python (a venv's), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def sampled_load(
    server: TorchServe, name: str, texts: list, clients: int, seconds: float, rate: int, raw: Path
) -> dict:
    """One load: requests/s, and CPU ms per request of the frontend, the worker, and each component
    (py-spy's samples kept in `raw`)."""
    pid = server.worker_pids(name)[0]
    meter = cpu.CpuMeter({"frontend": server.frontend_pid(), "worker": pid})
    command = [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--output", str(raw)]
    spy = subprocess.Popen([*command, "--duration", str(int(seconds)), "--nonblocking"], stdout=subprocess.DEVNULL)
    perf_data = raw.with_suffix(".perf")
    perf = on_cpu.record(pid, int(seconds), perf_data) if on_cpu.available() else None
    summary = loadtest.summarize_outcomes(loadtest.drive(server, name, texts, clients, seconds))
    spy.wait(timeout=seconds + 60)
    spent = meter.spent()
    samples = read_samples(raw.read_text())
    running = on_cpu.samples_of(perf, perf_data) if perf else {}
    answered = max(summary["ok"], 1)
    per_request = {part: 1000 * spent[part] / answered for part in ("frontend", "worker", "clients")}
    parts = {component: 1000 * count / rate / answered for component, count in samples.items()}
    parts["model call"] = per_request["worker"] - sum(value for key, value in parts.items() if key != "model call")
    return {
        "clients": clients,
        "requests_per_second": summary["requests_per_second"],
        "ok": summary["ok"],
        "errors": summary["errors"] + summary["lost"],
        "cpu_ms_per_request": per_request,
        "worker_ms_per_request": dict(sorted(parts.items(), key=lambda item: -item[1])),
        "on_cpu_ms_per_request": on_cpu.ms_per_item(running, spent["worker"], answered),
        "perf_coverage": sum(running.values()) * on_cpu.PERIOD_NS / 1e9 / max(spent["worker"], 1e-9),
    }


def raw_path(out: Path, archive: str, clients: int, round_: int) -> Path:
    """Where a load's py-spy samples are kept, beside the JSON (runs/profile_worker.HEAD.16.r1.raw.txt)."""
    return out.with_name(f"{out.stem}.{archive}.{clients}.r{round_}.raw.txt")


def median_load(rounds: list[dict]) -> dict:
    """One archive's load over its rounds: the median of every figure."""
    figures = ("requests_per_second", "ok", "errors", "perf_coverage")
    found = {key: statistics.median(load[key] for load in rounds) for key in figures}
    for part in ("cpu_ms_per_request", "worker_ms_per_request", "on_cpu_ms_per_request"):
        names = {name for load in rounds for name in load[part]}
        found[part] = {name: statistics.median(load[part].get(name, 0.0) for load in rounds) for name in names}
    return {"archive": rounds[0]["archive"], "clients": rounds[0]["clients"], "rounds": len(rounds), **found}


def not_the_model(load: dict) -> float:
    """The worker's CPU per request outside the model call, by py-spy's samples (time runnable)."""
    return sum(value for name, value in load["worker_ms_per_request"].items() if name != "model call")


def on_cpu_not_the_model(load: dict) -> float:
    """The worker's CPU per request outside the compiled model, by perf's samples (time running)."""
    return sum(value for name, value in load["on_cpu_ms_per_request"].items() if name != on_cpu.MODEL)


def print_table(result: dict) -> None:
    print(f"{result['machine']}, {result['contender']}, logging: {result['logging']}, rounds: {result['rounds']}")
    print("allocators: " + ", ".join(f"{choice} = {library}" for choice, library in result["allocators"].items()))
    loads = result["loads"]
    print(
        f"{'CPU ms per request (median)':30}" + "".join(f"{load['archive']:>11}/{load['clients']:<2}" for load in loads)
    )
    print(f"{'requests/s':30}" + "".join(f"{load['requests_per_second']:>14.1f}" for load in loads))
    print(f"{'frontend':30}" + "".join(f"{load['cpu_ms_per_request']['frontend']:>14.2f}" for load in loads))
    print(f"{'worker':30}" + "".join(f"{load['cpu_ms_per_request']['worker']:>14.2f}" for load in loads))
    names = [name for name, _ in COMPONENTS] + [LOGGING, OTHER]
    for name in names:
        print(f"{'  ' + name:30}" + "".join(f"{load['worker_ms_per_request'].get(name, 0.0):>14.2f}" for load in loads))
    print(f"{'  (not the model)':30}" + "".join(f"{not_the_model(load):>14.2f}" for load in loads))
    if not all(load["on_cpu_ms_per_request"] for load in loads):
        print("perf could not record: no split of the worker's CPU by time on a core")
        return
    print("on a core (perf: running, not waiting for one)")
    for name in on_cpu.KINDS:
        print(f"{'  ' + name:30}" + "".join(f"{load['on_cpu_ms_per_request'][name]:>14.2f}" for load in loads))
    print(f"{'  (not the model)':30}" + "".join(f"{on_cpu_not_the_model(load):>14.2f}" for load in loads))
    print(f"{'  (perf samples / CPU)':30}" + "".join(f"{load['perf_coverage']:>14.2f}" for load in loads))


def build_archives(args, model_dir: Path, store: Path) -> dict:
    """{label: model name} of the archives to profile: this tree's, and `--against`'s."""
    contender = "scheduled" if args.scheduled else "batches"
    config = {"asyncCommunication": True} if args.scheduled else {"batchSize": args.batch_size}
    build_mar.build(model_dir, "embedding", contender, store, config)
    archives = {"HEAD": contender}
    if args.against:
        revision = at_revision.short(args.against)
        at_revision.build_at(revision, model_dir, "embedding", f"{contender}-{revision}", store, config)
        archives = {revision: f"{contender}-{revision}", **archives}
    return archives


def profile(contenders: dict, texts: list, args) -> list[dict]:
    """Every load on every contender ({label: (server, model name)}), `--rounds` times, interleaved;
    the median load of each."""
    duration = 3 if args.quick else args.duration
    for server, name in contenders.values():
        server.register(f"{name}.mar", workers=1)
        loadtest.drive(server, name, texts, max(args.loads), min(duration, 5))  # warm the sockets
    time.sleep(1)
    found = {(label, clients): [] for label in contenders for clients in args.loads}
    for round_ in range(1, args.rounds + 1):
        for label, (server, name) in contenders.items():
            for clients in args.loads:
                raw = raw_path(args.out, label, clients, round_)
                load = sampled_load(server, name, texts, clients, duration, args.rate, raw)
                found[label, clients].append({"archive": label, **load})
    return [median_load(rounds) for rounds in found.values()]


def contenders_on(servers: dict, archives: dict) -> dict:
    """{label: (server, model name)}: this tree's archive on every server ({allocator: server}), the
    `--against` revision's on the first alone (labelled with the allocator where there are several)."""
    first = next(iter(servers))
    found = {}
    for label, name in archives.items():
        for choice, server in servers.items():
            if label == "HEAD" or choice == first:
                found[label if len(servers) == 1 else f"{label}@{choice}"] = (server, name)
    return found


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", type=Path, help="HF model folder (default: the embedded MiniLM)")
    parser.add_argument("--async", dest="scheduled", action="store_true", help="the token scheduler")
    parser.add_argument("--loads", type=int, nargs="+", default=[16, 32], help="clients of each load")
    parser.add_argument("--duration", type=float, default=30, help="seconds per load")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--against", metavar="REVISION", help="also profile the archive this git revision builds")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every load on every archive, interleaved")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="request batches' batchSize, every archive alike, so that the code is compared (8: the archives' "
        "default until 2026-11-26, the baseline's; 32 is today's)",
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny random model, 3 s per load")
    parser.add_argument(
        "--torchserve-logging", action="store_true", help="TorchServe's own log4j2 configuration, not ours (a baseline)"
    )
    parser.add_argument(
        "--allocators",
        nargs="+",
        default=["auto"],
        metavar="CHOICE",
        help="a server per allocator (auto, system or a library's path: handlers/runtime/allocator.py), in turns",
    )
    parser.add_argument("--out", type=Path, default=Path("runs") / "profile_worker.json")
    args = parser.parse_args(argv)
    if py_spy() is None:
        raise UserError("py-spy is not installed beside this Python or on PATH: pip install py-spy")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        model_dir = args.model or loadtest.default_model(args.quick, temp)
        archives = build_archives(args, model_dir, temp / "store")
        from transformers import AutoTokenizer

        lengths = traffic_lengths(5000, 0, high=256)
        texts = list(zip(texts_of_lengths(AutoTokenizer.from_pretrained(model_dir), lengths, 0), lengths, strict=True))
        servers = {
            choice: TorchServe.on_free_ports(temp / f"server-{choice}", temp / "store", {allocator.SETTING: choice})
            for choice in args.allocators
        }
        base = None
        if args.torchserve_logging:  # our config without the vmargs line that names our log4j2.xml
            base = temp / "config.properties"
            lines = TEMPLATE.read_text().splitlines()
            base.write_text("\n".join(line for line in lines if not line.startswith("vmargs=")) + "\n")
        try:
            for server in servers.values():
                server.start(base_config=base)
            loads = profile(contenders_on(servers, archives), texts, args)
        finally:
            for server in servers.values():
                server.stop()
    result = {
        "machine": measure.machine_summary(),
        "contender": "scheduled" if args.scheduled else "batches",
        "logging": "TorchServe's log4j2.xml" if args.torchserve_logging else "ours",
        "rounds": args.rounds,
        "allocators": {choice: server.env.get("LD_PRELOAD", "glibc") for choice, server in servers.items()},
        "loads": loads,
    }
    print_table(result)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
