"""Token scheduling in the worker against TorchServe's request batches, through one real TorchServe.

The same model built twice: `scheduled` (`asyncCommunication: true`: handlers/loops/token_scheduler.py) and
`batches` (the default: TorchServe's request batches, `batchSize` 32, `maxBatchDelay` 5 ms). Both are registered on one
server (loopback, token auth, 1 worker each) and driven in turn, never at once:
- lone: one client sending one short query at a time (latency p50);
- long-tailed: `--clients` (16) closed-loop clients on the seeded traffic (token lengths
  lognormal, median 30, clipped to 5..256): requests/s, p50, p99;
- saturated: `--saturate` (32) clients on the same traffic: real tokens served per second, against
  the same engine on the same texts in this process (the archive's settings, calls of the
  scheduler's token budget, the model calls alone timed).
The lone query is also sent to TorchServe's floor, a handler that does nothing
(benchmarks/floor_handler.py, same batchSize and maxBatchDelay), and timed in this process through
the engine (a 1x16 call): a served lone query should cost at most the floor, the model and 3 ms.
Every answer must be a 200; RecompilesAfterReady must stay 0. Each run also reports the CPU that
the frontend, the worker and the clients spent per request (read from /proc), and from it the
ceilings: what a scheduled worker costing only its model's in-process CPU could serve on these
cores beside that frontend and those clients.

    python benchmarks/benchmark_scheduler.py               # MiniLM, 40 s per scenario and contender, ~10 minutes
    python benchmarks/benchmark_scheduler.py --threads 1   # the scheduled worker with 1 intra-op thread
    python benchmarks/benchmark_scheduler.py --quick       # tiny random model, 2 s each: a smoke run

Prints a table and writes runs/benchmark_scheduler.json.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from ts_compiled_handlers.benchmarks import cpu, loadtest, measure
from ts_compiled_handlers.benchmarks.in_process import ready_handler
from ts_compiled_handlers.benchmarks.traffic import texts_of_lengths, traffic_lengths
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.serve import TorchServe

CONTENDERS = {  # name: model-config over the build's defaults
    "batches": {},
    "scheduled": {"asyncCommunication": True},
}
LONE_QUERY = "what is the capital of france"
TARGETS = {  # check: (least or most, bound)
    "lone p50 scheduled / batches": ("<=", 0.7),
    "long-tailed req/s scheduled / batches": (">=", 1.25),
    "long-tailed p99 / p50, scheduled": ("<=", 2.5),
    "saturated tokens/s served / in process, scheduled": (">=", 0.8),
    "saturated tokens/s served / in process, batches": (">=", 0.75),
}
LONE_MARGIN_MS = 3.0  # a served lone query: at most the floor's p50 + the model's in-process time + this
FLOOR = "floor"


def scenario(server: TorchServe, name: str, texts: list, clients: int, duration: float) -> dict:
    """One contender driven; with the CPU that the frontend, its worker and the clients spent per request."""
    meter = cpu.CpuMeter({"frontend": server.frontend_pid(), "worker": server.worker_pids(name)[0]})
    began = time.perf_counter()
    summary = loadtest.summarize_outcomes(loadtest.drive(server, name, texts, clients, duration))
    spent, elapsed = meter.spent(), time.perf_counter() - began
    summary.pop("latencies")
    summary["cpu_ms_per_request"] = {part: 1000 * seconds / max(summary["ok"], 1) for part, seconds in spent.items()}
    summary["cores_busy"] = sum(spent.values()) / elapsed
    return summary


def served(server: TorchServe, lone: list, texts: list, args) -> dict:
    """Each scenario, the contenders in turn within it (the floor first, in the lone one); each
    contender's recompiles at the end."""
    runs = {name: {} for name in CONTENDERS}
    runs[FLOOR] = {"lone": scenario(server, FLOOR, lone, 1, args.duration)}
    for label, stream, clients in (
        ("lone", lone, 1),
        ("long-tailed", texts, args.clients),
        ("saturated", texts, args.saturate),
    ):
        for name in CONTENDERS:
            runs[name][label] = scenario(server, name, stream, clients, args.duration)
            print(f"{name:>9} {label:<11} {runs[name][label]['requests_per_second']:7.1f} req/s", flush=True)
    metrics = server.metrics()
    for name in CONTENDERS:
        runs[name]["recompiles_after_ready"] = loadtest.gauge(metrics, "RecompilesAfterReady", name)
    return runs


def in_process(model_dir: Path, config: dict, texts: list, seconds: float, caps: list[int]) -> dict:
    """The scheduled archive's engine over the same texts in this process, the model calls alone timed:
    in calls of its token budget (the target's measure), then also of at most `cap` requests each
    (the most a call can hold with `cap` closed-loop clients), for about `seconds` each; and the
    lone query's call (its median)."""
    import torch

    handler = ready_handler("embedding", model_dir, **{"dtype": "auto", **config["handler"]})
    budget = handler.engine.plan.full_call_tokens
    token_ids = [handler.tokenize([text]).token_ids[0] for text, _ in texts]
    found = {"call_tokens": budget, "threads": torch.get_num_threads()}
    lone = handler.tokenize([LONE_QUERY]).token_ids
    found["lone_call_ms"] = 1000 * statistics.median(
        measure.time_calls(lambda: handler.engine.run(lone), 20, 300, handler.engine.device)
    )
    found["tokens_per_second"] = engine_tokens_per_second(handler.engine, calls_of(token_ids, budget), seconds)
    for cap in caps:
        calls = calls_of(token_ids, budget, cap)
        found[f"tokens_per_second_calls_of_{cap}"] = engine_tokens_per_second(handler.engine, calls, seconds)
    return found


def calls_of(token_ids: list, budget: int, most_requests: int | None = None) -> list[list]:
    """The texts in order, cut into calls of at most `budget` tokens and `most_requests` requests."""
    calls, current = [], []
    for ids in token_ids:
        if current and (sum(map(len, current)) + len(ids) > budget or len(current) == most_requests):
            calls.append(current)
            current = []
        current.append(ids)
    return [*calls, current]


def engine_tokens_per_second(engine, calls: list[list], seconds: float) -> float:
    tokens, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        for call in calls:
            engine.run(call)
            tokens += sum(map(len, call))
            if time.perf_counter() - began >= seconds:
                break
    return tokens / (time.perf_counter() - began)


def ceilings(runs: dict, in_process: dict, args) -> dict:
    """What a scheduled worker costing only its model's in-process CPU could serve on these cores,
    given the CPU the frontend and the clients took per request in the scheduled runs."""
    found = {"cores": cpu.cores()}
    for label, clients, target in (
        ("long-tailed", args.clients, "req/s / batches"),
        ("saturated", args.saturate, "tokens/s / in process"),
    ):
        run = runs["scheduled"][label]
        tokens_each = run["tokens_per_second"] / run["requests_per_second"]
        model = in_process["threads"] * tokens_each / in_process[f"tokens_per_second_calls_of_{clients}"]
        others = (run["cpu_ms_per_request"]["frontend"] + run["cpu_ms_per_request"]["clients"]) / 1000
        most = cpu.ceiling_per_second(found["cores"], model, others)
        against = (
            runs["batches"][label]["requests_per_second"]
            if label == "long-tailed"
            else in_process["tokens_per_second"] / tokens_each
        )
        found[label] = {"model_cpu_ms": 1000 * model, "frontend_and_clients_cpu_ms": 1000 * others}
        found[label].update(most_requests_per_second=most, ceiling=most / against, measure=target)
    return found


def checks(runs: dict, in_process: dict) -> list[dict]:
    scheduled, batches = runs["scheduled"], runs["batches"]
    values = {
        "lone p50 scheduled / batches": scheduled["lone"]["latency"]["p50"] / batches["lone"]["latency"]["p50"],
        "long-tailed req/s scheduled / batches": scheduled["long-tailed"]["requests_per_second"]
        / batches["long-tailed"]["requests_per_second"],
        "long-tailed p99 / p50, scheduled": scheduled["long-tailed"]["latency"]["p99"]
        / scheduled["long-tailed"]["latency"]["p50"],
        "saturated tokens/s served / in process, scheduled": scheduled["saturated"]["tokens_per_second"]
        / in_process["tokens_per_second"],
        "saturated tokens/s served / in process, batches": batches["saturated"]["tokens_per_second"]
        / in_process["tokens_per_second"],
    }
    found = lone_checks(runs, in_process)
    for name, value in values.items():
        sense, bound = TARGETS[name]
        met = value <= bound if sense == "<=" else value >= bound
        found.append({"check": name, "value": value, "target": f"{sense} {bound}", "met": met})
    lost = sum(
        runs[name][label]["lost"] + runs[name][label]["errors"]
        for name in CONTENDERS
        for label in ("lone", "long-tailed", "saturated")
    )
    found.append({"check": "requests without a 200, all runs", "value": lost, "target": "0", "met": lost == 0})
    recompiles = [runs[name]["recompiles_after_ready"] for name in CONTENDERS]
    met = recompiles == [0] * len(recompiles)
    found.append({"check": "recompiles after ready", "value": recompiles, "target": "0", "met": met})
    return found


def lone_checks(runs: dict, in_process: dict) -> list[dict]:
    """Each contender's lone query p50 against the floor's p50 + the model's in-process call + the margin."""
    floor_ms = 1000 * runs[FLOOR]["lone"]["latency"]["p50"]
    bound = floor_ms + in_process["lone_call_ms"] + LONE_MARGIN_MS
    target = f"<= {bound:.1f} (floor {floor_ms:.1f} + model {in_process['lone_call_ms']:.1f} + {LONE_MARGIN_MS:g})"
    found = []
    for name in CONTENDERS:
        value = 1000 * runs[name]["lone"]["latency"]["p50"]
        found.append({"check": f"lone p50 ms, {name}", "value": value, "target": target, "met": value <= bound})
    return found


def print_report(runs: dict, in_process: dict, found: list[dict], bounds: dict, machine: str) -> None:
    print(f"\n{machine}")
    print(
        f"{'contender':<10} {'scenario':<12} {'req/s':>7} {'tokens/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'lost':>5}"
        f" | CPU ms per request: {'frontend':>8} {'worker':>7} {'clients':>7} | {'cores':>5}"
    )
    for name, run in runs.items():
        for label in [label for label in ("lone", "long-tailed", "saturated") if label in run]:
            row, latency, spent = run[label], run[label]["latency"], run[label]["cpu_ms_per_request"]
            print(
                f"{name:<10} {label:<12} {row['requests_per_second']:7.1f} {row['tokens_per_second']:9.0f} "
                f"{latency['p50'] * 1000:7.1f} {latency['p99'] * 1000:7.1f} {row['lost'] + row['errors']:5d}"
                f" | {'':>19} {spent['frontend']:8.2f} {spent['worker']:7.2f} {spent['clients']:7.2f}"
                f" | {row['cores_busy']:5.2f}"
            )
    print(f"in process, same engine and texts: {in_process['tokens_per_second']:.0f} tokens/s")
    for check in found:
        value = check["value"] if not isinstance(check["value"], float) else f"{check['value']:.3f}"
        print(f"  {'ok ' if check['met'] else 'MISS'} {check['check']}: {value} (target {check['target']})")
    print(f"Ceilings on these {bounds['cores']} cores: a scheduled worker costing only its model's in-process CPU")
    for label in ("long-tailed", "saturated"):
        bound = bounds[label]
        print(
            f"  {label}: model {bound['model_cpu_ms']:.2f} + frontend and clients "
            f"{bound['frontend_and_clients_cpu_ms']:.2f} CPU ms per request -> at most "
            f"{bound['most_requests_per_second']:.1f} req/s, {bound['measure']} {bound['ceiling']:.3f}"
        )


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", type=Path, help="HF model folder (default: the embedded MiniLM)")
    parser.add_argument("--clients", type=int, default=16, help="clients of the long-tailed scenario")
    parser.add_argument("--saturate", type=int, default=32, help="clients of the saturated scenario")
    parser.add_argument("--duration", type=float, default=40, help="seconds per scenario and contender")
    parser.add_argument("--seed", type=int, default=0, help="seed of the traffic")
    parser.add_argument("--threads", type=int, help="the scheduled worker's intra-op threads (default: auto)")
    parser.add_argument("--batch-size", type=int, help="request batches' batchSize (default: the build's, 32)")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny random model, 2 s per scenario")
    parser.add_argument(
        "--fill-ms", type=int, nargs="*", default=[], help="also the scheduler with each `scheduler.fill_ms`"
    )
    parser.add_argument("--out", type=Path, default=Path("runs") / "benchmark_scheduler.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.saturate, args.duration = 4, 8, 2.0
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        model_dir = args.model or loadtest.default_model(args.quick, temp)
        if args.threads:
            CONTENDERS["scheduled"] = {**CONTENDERS["scheduled"], "handler": {"threads": args.threads}}
        if args.batch_size:
            CONTENDERS["batches"] = {**CONTENDERS["batches"], "batchSize": args.batch_size}
        for fill_ms in args.fill_ms:  # the scheduler letting calls fill under load
            scheduler = {"scheduler": {"fill_ms": fill_ms}, **CONTENDERS["scheduled"].get("handler", {})}
            CONTENDERS[f"fill-{fill_ms}"] = {**CONTENDERS["scheduled"], "handler": scheduler}
        for name, config in CONTENDERS.items():
            build_mar.build(model_dir, "embedding", name, temp / "store", config)
        floor = Path(__file__).parent / "floor_handler.py"
        build_mar.build(model_dir, "embedding", FLOOR, temp / "store", {}, handler_file=floor)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        lengths = traffic_lengths(5000, args.seed, high=256)
        texts = list(zip(texts_of_lengths(tokenizer, lengths, args.seed), lengths, strict=True))
        lone = [(LONE_QUERY, len(tokenizer(LONE_QUERY).input_ids))]
        server = TorchServe.on_free_ports(temp / "server", temp / "store")
        server.start()
        try:
            for name in [*CONTENDERS, FLOOR]:
                server.register(f"{name}.mar", workers=1)
            runs = served(server, lone, texts, args)
        finally:
            server.stop()
        scheduled_config = build_mar.model_config("embedding", CONTENDERS["scheduled"])
        caps = [args.clients, args.saturate]
        found_in_process = in_process(model_dir, scheduled_config, texts, args.duration, caps)
    found, bounds = checks(runs, found_in_process), ceilings(runs, found_in_process, args)
    machine = measure.machine_summary()
    print_report(runs, found_in_process, found, bounds, machine)
    result = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}
    result.update(in_process=found_in_process, checks=found, ceilings=bounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
