"""Generation load test through a real TorchServe: continuous batching vs request batches, same traffic.

Two archives of one Llama-shaped random-weight model (scripts/make_tiny_models.py --generation-size
bench: hidden 256, 4 layers), registered side by side on one server (loopback, token auth):
`continuous` (`continuousBatching: true`, the default) and `batches` (`continuousBatching: false`:
a TorchServe batch generates to the end of its longest request). `--clients` clients each send
streamed requests one after another, starting at staggered times; request k of the seeded stream
has a prompt of 9-21 tokens, cut to the archives' one 16-token bucket (the end kept), and
`max_new_tokens` drawn from 4..128. Both contenders get the
same stream, in alternating rounds. Reported per run: generated tokens/s over the run, and the time
to the first streamed text of each request (TTFT); and, before the load, one request's TTFT alone.

    python benchmarks/loadtest_generation.py                  # 8 clients x 30 s, 3 rounds
    python benchmarks/loadtest_generation.py --steps 1 4 8 16 --rounds 1   # decode steps per handler call
    python benchmarks/loadtest_generation.py --quick          # CI smoke: 2 clients x 3 s, 1 round

Prints a table, writes runs/loadtest_generation.json.
"""

import argparse
import json
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from ts_compiled_handlers.benchmarks import measure
from ts_compiled_handlers.configuration.generation_config import GenerationConfig
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.make_tiny_models import make
from ts_compiled_handlers.scripts.serve import TorchServe

WORDS = "the cat sat on the mat and the dog ran to paris with alice bob carol".split()
TARGET_TOKENS_RATIO = 1.5  # continuous / batches, median generated tokens/s
TARGET_TTFT_RATIO = 3.0  # p50 TTFT under load / TTFT alone


def stream(server: TorchServe, name: str, prompt: str, new_tokens: int) -> dict:
    """One streamed request: seconds to its first text, in all, and tokens generated."""
    began = time.monotonic()
    body = json.dumps({"inputs": prompt, "max_new_tokens": new_tokens, "stream": True})
    headers = {**server.headers("inference"), "Content-Type": "application/json"}
    url = f"{server.inference_url}/predictions/{name}"
    first, received = None, b""
    with requests.post(url, data=body, headers=headers, stream=True, timeout=600) as response:
        for chunk in response.iter_content(chunk_size=None):
            first = first or time.monotonic() - began
            received += chunk
    final = json.loads(received.decode().splitlines()[-1]) if response.ok else {}
    tokens = final.get("generated_tokens", 0)
    return {"ttft": first, "seconds": time.monotonic() - began, "tokens": tokens, "ok": response.ok}


def traffic(count: int, seed: int) -> list[tuple[str, int]]:
    """Prompts of 8-12 words (9-21 tokens of the bench model) and budgets of 4..128 new tokens."""
    rng = random.Random(seed)
    return [(" ".join(rng.choices(WORDS, k=rng.randint(8, 12))), rng.randint(4, 128)) for _ in range(count)]


def drive(server: TorchServe, name: str, requests_: list, clients: int, duration: float, seed: int) -> dict:
    """`clients` closed-loop clients, starting over the first second, until `duration` has passed."""
    lock, outcomes, cursor = threading.Lock(), [], iter(requests_)
    end = time.monotonic() + duration

    def client(number: int) -> None:
        time.sleep(random.Random(seed + number).uniform(0, 1.0))  # staggered arrivals
        while time.monotonic() < end:
            with lock:
                prompt, new_tokens = next(cursor)
            outcome = stream(server, name, prompt, new_tokens)
            with lock:
                outcomes.append(outcome)

    began = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    span = time.monotonic() - began
    ttfts = [o["ttft"] for o in outcomes if o["ttft"] is not None]
    return {
        "requests": len(outcomes),
        "failed": sum(1 for o in outcomes if not o["ok"]),
        "tokens_per_second": sum(o["tokens"] for o in outcomes) / span,
        "ttft": measure.summarize(ttfts) if ttfts else None,
    }


def contenders(steps: list[int]) -> dict[str, int | None]:
    """Archive name -> decode steps per call (None: request batches). `continuous` is the default's."""
    default = GenerationConfig().steps_per_call
    names = {("continuous" if n == default else f"continuous-{n}-steps"): n for n in steps}
    return {**names, "batches": None}


def build_archives(model_dir: Path, store: Path, max_new_tokens: int, steps: list[int]) -> None:
    for name, steps_per_call in contenders(steps).items():
        generation = {"max_new_tokens": max_new_tokens, "steps_per_call": steps_per_call or 1}
        config = {
            "continuousBatching": steps_per_call is not None,
            "handler": {
                "dtype": "float32",
                "buckets": {"seq_lens": [16], "batch_sizes": [1, 2, 4, 8]},
                "generation": generation,
            },
        }
        build_mar.build(model_dir, "text-generation", name, store, config)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=30, help="seconds per contender and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    default = GenerationConfig().steps_per_call
    parser.add_argument("--steps", nargs="+", type=int, default=[default], help="decode steps per call")
    parser.add_argument("--quick", action="store_true", help="CI smoke: 2 clients x 3 s, 1 round, test-size model")
    parser.add_argument("--out", type=Path, default=Path("runs") / "loadtest_generation.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.duration, args.rounds = 2, 3.0, 1
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        size = "test" if args.quick else "bench"
        model_dir = make(temp / "model", ["text-generation"], generation_size=size)["text-generation"]
        build_archives(model_dir, temp / "store", 128, args.steps)
        names = list(contenders(args.steps))
        server = TorchServe.on_free_ports(temp / "server", temp / "store")
        server.start()
        try:
            for name in names:  # up to 8 requests a batch, gathered for 10 ms
                server.register(f"{name}.mar", batch_size=8, max_batch_delay=10)
            alone = {name: stream(server, name, *traffic(1, args.seed + 1)[0]) for name in names}
            rows = []
            for round_ in range(1, args.rounds + 1):
                for name in names:
                    stream_ = traffic(100_000, args.seed)
                    rows.append(
                        {
                            "contender": name,
                            "round": round_,
                            **drive(server, name, stream_, args.clients, args.duration, args.seed),
                        }
                    )
            metrics = server.metrics()
        finally:
            server.stop()
    return report(rows, alone, metrics, args, names)


def median(rows: list[dict], name: str, key) -> float:
    values = sorted(key(row) for row in rows if row["contender"] == name)
    return values[len(values) // 2]


def report(rows: list[dict], alone: dict, metrics: str, args, names: list[str]) -> dict:
    tokens = {name: median(rows, name, lambda row: row["tokens_per_second"]) for name in names}
    ttft = {name: median(rows, name, lambda row: row["ttft"]["p50"]) for name in names}
    recompiles = [line for line in metrics.splitlines() if line.startswith("RecompilesAfterReady{")]
    checks = []
    for name in names[:-1]:
        checks.append((f"{name} / batches, median tokens/s", tokens[name] / tokens["batches"], TARGET_TOKENS_RATIO))
        checks.append((f"{name} p50 TTFT under load / alone", ttft[name] / alone[name]["ttft"], TARGET_TTFT_RATIO))
    print(f"{measure.machine_summary()}; {args.clients} clients x {args.duration:g} s, {args.rounds} rounds")
    print(f"{'contender':<12}{'round':>6}{'requests':>9}{'failed':>7}{'tok/s':>9}{'TTFT p50 ms':>12}{'p90 ms':>8}")
    for row in rows:
        p50, p90 = (row["ttft"]["p50"] * 1e3, row["ttft"]["p90"] * 1e3) if row["ttft"] else (float("nan"),) * 2
        print(
            f"{row['contender']:<12}{row['round']:>6}{row['requests']:>9}{row['failed']:>7}"
            f"{row['tokens_per_second']:>9.1f}{p50:>12.0f}{p90:>8.0f}"
        )
    for name, outcome in alone.items():
        print(f"{name}: one request alone, TTFT {outcome['ttft'] * 1e3:.0f} ms")
    print("\n".join(recompiles))
    result = {"rows": rows, "alone": alone, "recompiles": recompiles, "checks": []}
    for name, value, target in checks:
        at_least = "tokens" in name
        met = value >= target if at_least else value <= target
        result["checks"].append({"check": name, "value": value, "target": target, "met": met})
        print(f"  {name:<44}{value:>7.2f}  target {'>=' if at_least else '<='} {target}  {'met' if met else 'MISSED'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
