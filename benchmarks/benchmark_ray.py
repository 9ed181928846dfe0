"""The same archive on Ray against TorchServe, and Ray Data against the same engine in process.

One run, one contender at a time, MiniLM's AOT archive as `hfserve build --precompile aot` makes it:
- TorchServe (loopback, token auth, 1 worker, the archive's request batches: batchSize 32,
  maxBatchDelay 5 ms), then one Ray Serve replica of the same archive (`num_cpus` = the machine's
  cores: as many threads as the TorchServe worker) on a fresh local Ray, twice: behind Serve's own
  HTTP proxy (the default), and behind HAProxy straight to the replica's own HTTP server
  (`RAY_SERVE_ENABLE_HA_PROXY=1`); each driven by
  - lone: one client sending one short query at a time (latency p50);
  - loaded: `--clients` (16) closed-loop clients on seeded long-tailed traffic (lognormal lengths,
    median 30 tokens): requests/s, p50, p99;
  with the CPU per request of the server's front (TorchServe's Java frontend; Serve's proxy or
  HAProxy) and of its worker (the TorchServe worker; the replica), read from /proc;
- Ray Data: `--texts` (20,000) texts of the same traffic through `map_batches(Embedder)` with one
  actor per core (one CPU each), real tokens per second per CPU from the first batch out to the
  last (the actors' start-up excluded), against the same code (`ArchiveBatches.answers`) on one
  thread in this process.

    python benchmarks/benchmark_ray.py             # MiniLM, 30 s per scenario, ~8 minutes
    python benchmarks/benchmark_ray.py --quick     # tiny random model, 3 s each: a smoke run

Prints a table and writes runs/benchmark_ray.json. Needs the `ray` extra.
"""

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from ts_compiled_handlers.benchmarks import cpu, loadtest, measure
from ts_compiled_handlers.benchmarks.traffic import texts_of_lengths, traffic_lengths
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.serve import TorchServe, free_ports

LONE_QUERY = "what is the capital of france"
KEY = "benchmark-key"
TARGETS = {  # check: (least or most, bound)
    "lone p50 Ray / TorchServe": ("<=", 1.0),
    "loaded req/s Ray / TorchServe": (">=", 0.9),
    "Ray Data tokens/s per CPU / in process": (">=", 0.8),
}


class RayEndpoint:
    """What loadtest.drive needs of a server, for Serve's proxy."""

    def __init__(self, url: str):
        self.inference_url = url

    def headers(self, api: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEY}"}


def scenarios(server, name: str, pids: dict[str, int], lone: list, texts: list, args) -> dict:
    runs = {}
    for label, stream, clients in (("lone", lone, 1), ("loaded", texts, args.clients)):
        meter = cpu.CpuMeter(pids)
        began = time.perf_counter()
        summary = loadtest.summarize_outcomes(loadtest.drive(server, name, stream, clients, args.duration))
        spent, elapsed = meter.spent(), time.perf_counter() - began
        summary.pop("latencies")
        summary["cpu_ms_per_request"] = {part: 1000 * s / max(summary["ok"], 1) for part, s in spent.items()}
        summary["cores_busy"] = sum(spent.values()) / elapsed
        runs[label] = summary
        p50 = 1000 * summary["latency"]["p50"]
        print(f"{label:<7} {summary['requests_per_second']:7.1f} req/s  p50 {p50:.1f} ms", flush=True)
    return runs


def on_torchserve(store: Path, scratch: Path, lone: list, texts: list, args) -> dict:
    server = TorchServe.on_free_ports(scratch / "torchserve", store)
    server.start()
    try:
        server.register("minilm.mar", workers=1)
        pids = {"front": server.frontend_pid(), "worker": server.worker_pids("minilm")[0]}
        return scenarios(server, "minilm", pids, lone, texts, args)
    finally:
        server.stop()


def on_ray_serve(archive: Path, lone: list, texts: list, args, haproxy: bool) -> dict:
    """One replica of the archive on a fresh local Ray, behind Serve's own HTTP proxy or, with
    `haproxy`, behind HAProxy forwarding straight to the replica's HTTP server
    (RAY_SERVE_ENABLE_HA_PROXY=1, read when Ray starts)."""
    import ray
    from ray import serve
    from ray._private import state

    from ts_compiled_handlers.servers.ray.serve import KEY_ENV, app

    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1" if haproxy else "0"
    ray.init(num_cpus=cpu.cores(), include_dashboard=False)
    port = free_ports(1)[0]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    os.environ[KEY_ENV] = KEY  # read where the application is built, here
    options = {"archive": str(archive), "ray_actor_options": {"num_cpus": cpu.cores()}}
    serve.run(app(options), name="minilm", route_prefix="/")
    actors = [actor for actor in state.actors().values() if actor["State"] == "ALIVE"]
    replica = next(actor["Pid"] for actor in actors if actor["ActorClassName"].startswith("ServeReplica:"))
    front = haproxy_pid() if haproxy else next(a["Pid"] for a in actors if a["ActorClassName"] == "ProxyActor")
    try:
        return scenarios(
            RayEndpoint(f"http://127.0.0.1:{port}"), "minilm", {"front": front, "worker": replica}, lone, texts, args
        )
    finally:
        serve.shutdown()
        ray.shutdown()
        os.environ.pop("RAY_SERVE_ENABLE_HA_PROXY")


def haproxy_pid() -> int:
    """The HAProxy serving now: Ray reloads it (a new process) as routes change, so the newest, once settled."""
    time.sleep(5)
    return int(subprocess.run(["pgrep", "-n", "-x", "haproxy"], capture_output=True, text=True).stdout)


def ray_data(archive: Path, texts: list[str], tokens: int) -> dict:
    """Real tokens per second per CPU: one actor per core through Ray Data, then one thread here."""
    import ray

    from ts_compiled_handlers.servers.ray.data import ArchiveBatches, Embedder

    actors = cpu.cores()
    dataset = ray.data.from_items([{"text": text} for text in texts]).map_batches(
        Embedder,
        fn_constructor_kwargs={"archive": str(archive)},
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=1,
        batch_size=256,
    )
    arrivals, rows = [], []
    for batch in dataset.iter_batches(batch_size=None):
        arrivals.append(time.perf_counter())
        rows.append(len(batch["text"]))
    # From the first batch out to the last: the actors' start-up and the pipeline's fill left out.
    timed_tokens = tokens * (sum(rows) - rows[0]) / sum(rows)
    distributed = timed_tokens / (arrivals[-1] - arrivals[0]) / actors
    ray.shutdown()

    from ts_compiled_handlers.servers.archive import Archive, with_threads

    opened = Archive.open(archive)
    handler = opened.handler_class()
    batches = ArchiveBatches.__new__(ArchiveBatches)
    placement = opened.placement(with_threads(opened.yaml_config, 1))
    batches.worker = handler.worker_class.build(placement, handler.task_class)
    began = time.perf_counter()
    for start in range(256, len(texts), 256):  # the first batch left out, as above
        batches.answers(texts[start : start + 256])
    local = tokens * (len(texts) - 256) / len(texts) / (time.perf_counter() - began)
    return {"actors": actors, "tokens_per_second_per_cpu": distributed, "in_process_tokens_per_second": local}


def checks(torchserve: dict, ray_serve: dict, data: dict) -> list[dict]:
    """The targets, for the better of Ray's two ingresses (`ray_serve`)."""
    found = {
        "lone p50 Ray / TorchServe": ray_serve["lone"]["latency"]["p50"] / torchserve["lone"]["latency"]["p50"],
        "loaded req/s Ray / TorchServe": ray_serve["loaded"]["requests_per_second"]
        / torchserve["loaded"]["requests_per_second"],
        "Ray Data tokens/s per CPU / in process": data["tokens_per_second_per_cpu"]
        / data["in_process_tokens_per_second"],
    }
    rows = []
    for name, value in found.items():
        sense, bound = TARGETS[name]
        met = value <= bound if sense == "<=" else value >= bound
        rows.append({"check": name, "value": round(value, 3), "target": f"{sense} {bound}", "met": met})
    failed = sum(run[label]["lost"] + run[label]["errors"] for run in (torchserve, ray_serve) for label in run)
    rows.append({"check": "requests without a 200, all runs", "value": failed, "target": "0", "met": failed == 0})
    return rows


def print_report(runs: dict, data: dict, found: list[dict], machine: str) -> None:
    print(f"\n{machine}")
    header = ("server", "scenario", "req/s", "p50 ms", "p99 ms", "front ms/req", "worker ms/req")
    print("{:<11} {:<8} {:>7} {:>7} {:>7} {:>12} {:>13}".format(*header))
    for server, scenario_runs in runs.items():
        for label, run in scenario_runs.items():
            spent, latency = run["cpu_ms_per_request"], run["latency"]
            print(
                f"{server:<11} {label:<7} {run['requests_per_second']:7.1f} {1000 * latency['p50']:7.1f} "
                f"{1000 * latency['p99']:7.1f} "
                f"{spent['front']:12.2f} {spent['worker']:13.2f}"
            )
    print(
        f"Ray Data: {data['tokens_per_second_per_cpu']:.0f} real tokens/s per CPU ({data['actors']} actors); "
        f"the same engine in process, 1 thread: {data['in_process_tokens_per_second']:.0f}"
    )
    for row in found:
        value = f"{row['value']:7.3f}" if isinstance(row["value"], float) else f"{row['value']!s:>7}"
        print(f"  {row['check']:<42} {value}  target {row['target']:<7} {'met' if row['met'] else 'NOT MET'}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", type=Path, help="model folder (default: MiniLM, or a tiny model with --quick)")
    parser.add_argument("--duration", type=float, default=30, help="seconds per scenario and server")
    parser.add_argument("--clients", type=int, default=16, help="closed-loop clients of the loaded scenario")
    parser.add_argument("--texts", type=int, default=20000, help="texts of the Ray Data job")
    parser.add_argument("--quick", action="store_true", help="tiny random model, 3 s per scenario, 2,000 texts")
    parser.add_argument("--output", type=Path, default=Path("runs/benchmark_ray.json"))
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    import ray
    from transformers import AutoTokenizer

    args = parse_args(argv)
    if args.quick:
        args.duration, args.texts = min(args.duration, 3), min(args.texts, 2000)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        model = args.model or loadtest.default_model(args.quick, scratch)
        store = scratch / "store"
        archive = build_mar.build(model, "embedding", "minilm", store, precompile="aot")
        tokenizer = AutoTokenizer.from_pretrained(model)
        lengths = traffic_lengths(max(args.texts, 300), seed=0)
        corpus = texts_of_lengths(tokenizer, lengths, seed=0)
        texts = [(text, length) for text, length in zip(corpus[:300], lengths, strict=False)]
        lone = [(LONE_QUERY, len(tokenizer(LONE_QUERY)["input_ids"]))]
        runs = {"TorchServe": on_torchserve(store, scratch, lone, texts, args)}
        runs["Ray Serve"] = on_ray_serve(archive, lone, texts, args, haproxy=False)
        runs["Ray+HAProxy"] = on_ray_serve(archive, lone, texts, args, haproxy=True)
        ray.init(num_cpus=cpu.cores() + 1, include_dashboard=False)  # one logical CPU more: Ray Data's reads
        job = corpus[: args.texts]
        tokens = sum(min(len(ids), 256) for ids in tokenizer(job)["input_ids"])
        data = ray_data(archive, job, tokens)
    best = max(("Ray Serve", "Ray+HAProxy"), key=lambda name: runs[name]["loaded"]["requests_per_second"])
    found = checks(runs["TorchServe"], runs[best], data)
    found.insert(0, {"check": "Ray's ingress checked", "value": best, "target": "", "met": True})
    machine = measure.machine_summary()
    print_report(runs, data, found, machine)
    report = {
        "machine": machine,
        "runs": runs,
        "ray_data": data,
        "checks": found,
        "args": vars(args) | {"model": str(model)},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    main()
