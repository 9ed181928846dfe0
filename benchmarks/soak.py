"""Soak test through a real TorchServe: concurrent clients, valid and invalid requests mixed.

    python benchmarks/soak.py                  # MiniLM, 16 clients x 60 s, every 5th request invalid
    python benchmarks/soak.py --quick          # tiny random model, 4 clients x 5 s
    python benchmarks/soak.py --kill-after 10  # kill -9 the worker 10 s in; report the recovery time

Each client sends, back to back, the next request of one seeded stream: a text of the traffic's
lengths as `{"inputs": ...}`, or every `--invalid-every`th request one of the bad bodies below.
Passes when no answer is lost (every request gets 200 or an explicit 4xx; no 5xx, no dropped
connection), when the errors are exactly the invalid requests, and when the worker's resident
memory grows by less than `--max-rss-growth` over the run. With `--kill-after`, the worker is
killed (SIGKILL) mid-run: only the requests of the batch it was running may get a 5xx, TorchServe
restarts it (warm from the host compile cache), and the recovery time is the span from the kill
to the first answer of a request sent after it; the run ends a few seconds after recovery.
Prints a table, writes runs/soak.json.
"""

import argparse
import dataclasses
import itertools
import json
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.benchmarks.loadtest import MAX_CLIENTS, MAX_DURATION, default_model
from ts_compiled_handlers.benchmarks.traffic import texts_of_lengths, traffic_lengths
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.serve import TorchServe

# (body, content type): each must get its own 4xx while the valid requests around it get 200.
INVALID_REQUESTS = [
    (b"", "application/json"),
    (b"\xff\xfe not utf-8", "text/plain"),
    (b'{"inputs": ', "application/json"),
    (b"42", "application/json"),
    (b'{"text": "no inputs key"}', "application/json"),
    (b'{"inputs": ["fine", 3]}', "application/json"),
    (b'{"inputs": [["nested"]]}', "application/json"),
    (b'{"inputs": []}', "application/json"),
    (b'{"inputs": "   "}', "application/json"),
    (b'{"inputs": "x", "unknown": 1}', "application/json"),
]


SETTLE_SECONDS = 3  # traffic kept up after a killed worker recovered


@dataclasses.dataclass
class Outcome:
    valid: bool
    sent: float
    seconds: float
    status: int | None  # None: no answer at all


@dataclasses.dataclass
class Kill:
    """The worker kill of one run: when, which process, and when the first answer after it came."""

    after: float
    pid: int | None = None
    at: float | None = None
    recovered_at: float | None = None


def worker_rss_mb(server: TorchServe, name: str) -> float:
    """Resident memory of the model's worker processes (same host: read from /proc)."""
    total_kb = 0
    for pid in server.worker_pids(name):
        status = Path(f"/proc/{pid}/status").read_text()
        total_kb += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return total_kb / 1024


def requests_stream(texts: list[str], invalid_every: int):
    """(valid, body, content type) forever: texts in order, every `invalid_every`th an invalid body."""
    invalid = itertools.cycle(INVALID_REQUESTS)
    for position, text in enumerate(itertools.cycle(texts), start=1):
        if invalid_every and position % invalid_every == 0:
            yield (False, *next(invalid))
        else:
            yield True, json.dumps({"inputs": text}).encode(), "application/json"


def kill_worker(server: TorchServe, name: str, kill: Kill) -> None:
    (kill.pid,) = server.worker_pids(name)[:1]
    kill.at = time.perf_counter()
    os.kill(kill.pid, signal.SIGKILL)


def drive(
    server: TorchServe, name: str, stream, clients: int, duration: float, kill: Kill | None, timeout: float = 300
) -> list[Outcome]:
    """Closed-loop clients until `duration` is up (or SETTLE_SECONDS after a killed worker answers
    again); a request unanswered after `timeout` seconds counts as no answer."""
    lock = threading.Lock()
    url = f"{server.inference_url}/predictions/{name}"
    began = time.perf_counter()
    deadline = began + duration

    def running() -> bool:
        now = time.perf_counter()
        recovered = kill is not None and kill.recovered_at is not None
        return now < deadline and not (recovered and now > kill.recovered_at + SETTLE_SECONDS)

    def client() -> list[Outcome]:
        outcomes = []
        with requests.Session() as session:
            while running():
                with lock:
                    valid, body, content_type = next(stream)
                headers = {**server.headers("inference"), "Content-Type": content_type}
                sent = time.perf_counter()
                try:
                    status = session.post(url, data=body, headers=headers, timeout=timeout).status_code
                except requests.RequestException:
                    status = None
                outcomes.append(Outcome(valid, sent, time.perf_counter() - sent, status))
                with lock:
                    if kill and kill.at and kill.recovered_at is None and sent > kill.at and status == 200:
                        kill.recovered_at = time.perf_counter()
        return outcomes

    killer = threading.Timer(kill.after, kill_worker, (server, name, kill)) if kill else None
    if killer:
        killer.start()
    with ThreadPoolExecutor(clients) as pool:
        outcomes = [outcome for result in pool.map(lambda _: client(), range(clients)) for outcome in result]
    if killer:
        killer.join()
    return outcomes


def soak(
    server: TorchServe,
    name: str,
    texts: list[str],
    clients: int,
    duration: float,
    invalid_every: int,
    kill_after: float | None = None,
    timeout: float = 300,
) -> dict:
    """Drive a registered model and count what came back; the worker's RSS before and after."""
    rss_start = worker_rss_mb(server, name)
    kill = Kill(kill_after) if kill_after is not None else None
    began = time.perf_counter()
    outcomes = drive(server, name, requests_stream(texts, invalid_every), clients, duration, kill, timeout)
    seconds = time.perf_counter() - began
    rss_end = worker_rss_mb(server, name)
    latencies = [o.seconds for o in outcomes if o.status == 200]
    recovered = kill is not None and kill.recovered_at is not None
    return {
        "requests": len(outcomes),
        "valid": sum(o.valid for o in outcomes),
        "invalid": sum(not o.valid for o in outcomes),
        "ok": sum(o.status == 200 for o in outcomes),
        "client_errors": sum(o.status is not None and 400 <= o.status < 500 for o in outcomes),
        "server_errors": sum(o.status is not None and o.status >= 500 for o in outcomes),
        "no_answer": sum(o.status is None for o in outcomes),
        # Answered, but not as it should be: a valid request refused, or an invalid one served.
        "wrong_answers": sum((o.status == 200) != o.valid for o in outcomes if o.status is not None and o.status < 500),
        "requests_per_second": len(outcomes) / seconds,
        "latency": measure.summarize(latencies) if latencies else None,
        "rss_start_mb": rss_start,
        "rss_end_mb": rss_end,
        "killed_pid": kill.pid if kill else None,
        "recovery_seconds": kill.recovered_at - kill.at if recovered else None,
    }


def verdict(result: dict, max_rss_growth: float, batch_size: int) -> list[str]:
    """What failed, in words (empty: passed). A killed worker may fail the one batch it was running."""
    failures = []
    allowed_5xx = batch_size if result["killed_pid"] else 0
    if result["no_answer"] or result["server_errors"] > allowed_5xx:
        failures.append(f"{result['no_answer']} requests unanswered, {result['server_errors']} got a 5xx")
    if result["killed_pid"] and result["recovery_seconds"] is None:
        failures.append("the killed worker did not answer again before the run ended")
    if result["wrong_answers"] or (not result["killed_pid"] and result["client_errors"] != result["invalid"]):
        failures.append(f"{result['client_errors']} errors for {result['invalid']} invalid requests")
    if not result["killed_pid"] and result["rss_end_mb"] > result["rss_start_mb"] * (1 + max_rss_growth):
        failures.append(f"worker RSS grew from {result['rss_start_mb']:.0f} to {result['rss_end_mb']:.0f} MB")
    return failures


def print_report(result: dict, failures: list[str], args) -> None:
    latency = result["latency"] or {}
    print(f"\nSoak: {args.clients} clients x {args.duration:.0f} s, every {args.invalid_every}th request invalid")
    print(f"{'requests':>9} {'valid':>6} {'invalid':>7} {'200':>6} {'4xx':>5} {'5xx':>4} {'none':>5} "
          f"{'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'RSS start':>10} {'RSS end':>8}")  # fmt: skip
    print(
        f"{result['requests']:>9} {result['valid']:>6} {result['invalid']:>7} {result['ok']:>6} "
        f"{result['client_errors']:>5} {result['server_errors']:>4} {result['no_answer']:>5} "
        f"{result['requests_per_second']:>7.1f} {latency.get('p50', 0) * 1000:>7.1f} "
        f"{latency.get('p99', 0) * 1000:>7.1f} {result['rss_start_mb']:>8.0f}MB {result['rss_end_mb']:>6.0f}MB"
    )
    if result["killed_pid"]:
        recovery = result["recovery_seconds"]
        print(
            f"worker {result['killed_pid']} killed {args.kill_after:.0f} s in; answering again after "
            + (f"{recovery:.1f} s" if recovery is not None else "- (not within the run)")
        )
    print("PASS" if not failures else "FAIL: " + "; ".join(failures))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="HF model folder (default: the embedded MiniLM)")
    parser.add_argument("--clients", type=int, default=16, help=f"concurrent clients (at most {MAX_CLIENTS})")
    parser.add_argument("--duration", type=float, default=60, help=f"seconds of traffic (at most {MAX_DURATION})")
    parser.add_argument("--invalid-every", type=int, default=5, help="every Nth request is invalid (0: none)")
    parser.add_argument("--batch-size", type=int, default=8, help="TorchServe batch size")
    parser.add_argument("--kill-after", type=float, help="kill -9 the worker this many seconds into the run")
    parser.add_argument("--max-rss-growth", type=float, default=0.2, help="allowed RSS growth, as a fraction")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny random model, 4 clients x 5 s")
    parser.add_argument("--out", type=Path, default=Path("runs") / "soak.json")
    args = parser.parse_args(argv)
    if not (1 <= args.clients <= MAX_CLIENTS and 0 < args.duration <= MAX_DURATION and args.invalid_every >= 0):
        parser.error(f"--clients must be 1..{MAX_CLIENTS}, --duration 0..{MAX_DURATION} s, --invalid-every >= 0")
    if args.quick:
        args.clients, args.duration = 4, 5.0
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        model_dir = args.model or default_model(args.quick, temp)
        grid = {"buckets": {"seq_lens": [16, 64], "batch_sizes": [1, 8]}} if args.quick else {}
        build_mar.build(model_dir, "embedding", "soak", temp / "store", {"handler": grid})
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        texts = texts_of_lengths(tokenizer, traffic_lengths(2000, seed=0, high=64 if args.quick else 256), seed=0)
        # A host compile cache of the run's own: a restarted worker loads what the first one compiled.
        cache = {"HFSERVE_CACHE_DIR": str(temp / "compile-cache")}
        server = TorchServe.on_free_ports(temp / "server", temp / "store", env=cache)
        server.start()
        try:
            server.register("soak.mar", batch_size=args.batch_size, max_batch_delay=10, workers=1)
            result = soak(server, "soak", texts, args.clients, args.duration, args.invalid_every, args.kill_after)
        finally:
            server.stop()
    failures = verdict(result, args.max_rss_growth, args.batch_size)
    print_report(result, failures, args)
    report = {"machine": measure.machine_summary(), "args": {k: str(v) for k, v in vars(args).items()}}
    report.update(result=result, failures=failures, passed=not failures)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    sys.exit(0 if main()["passed"] else 1)
