import itertools
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ts_compiled_handlers.benchmarks.loadtest import (
    Outcome,
    arrivals,
    drive_url,
    gauge,
    ratios,
    summarize_outcomes,
    worker_checks,
)
from ts_compiled_handlers.benchmarks.traffic import with_repeats

METRICS = """# HELP RecompilesAfterReady Torchserve prometheus gauge metric with unit: Count
# TYPE RecompilesAfterReady gauge
RecompilesAfterReady{ModelName="ours-auto",Level="Model",Hostname="h",} 0.0
RecompilesAfterReady{ModelName="ours-float32",Level="Model",Hostname="h",} 3.0
PaddedTokenRatio{ModelName="ours-auto",Level="Model",Hostname="h",} 1.4312
CachedTexts{ModelName="ours-cache",Level="Model",Outcome="miss",Hostname="h",} 60.0
CachedTexts{ModelName="ours-cache",Level="Model",Outcome="hit",Hostname="h",} 40.0
"""


def test_gauge_is_read_per_model():
    assert gauge(METRICS, "RecompilesAfterReady", "ours-auto") == 0.0
    assert gauge(METRICS, "RecompilesAfterReady", "ours-float32") == 3.0
    assert gauge(METRICS, "PaddedTokenRatio", "ours-auto") == pytest.approx(1.4312)
    assert gauge(METRICS, "PaddedTokenRatio", "stock") is None


def test_a_counter_is_read_under_its_label():
    assert gauge(METRICS, "CachedTexts", "ours-cache", 'Outcome="hit"') == 40.0
    assert gauge(METRICS, "CachedTexts", "ours-cache", 'Outcome="miss"') == 60.0


def test_a_stream_with_repeats_resends_earlier_texts_in_the_share_asked_for():
    items = list(range(5000))
    assert with_repeats(items, 0.0, 0) == items
    stream = with_repeats(items, 0.4, 0)
    assert stream == with_repeats(items, 0.4, 0) and len(stream) == len(items)
    repeats = [index for index, item in enumerate(stream) if item != index]
    assert 0.37 < len(repeats) / len(items) < 0.43
    assert all(stream[index] in stream[:index] for index in repeats)


def test_outcomes_count_errors_and_lost_requests_apart():
    outcomes = [
        Outcome(0.0, 0.5, 200, 10),
        Outcome(0.5, 0.5, 200, 30),
        Outcome(1.0, 1.0, 503, 20),
        Outcome(1.5, 0.5, None, 20),
    ]
    summary = summarize_outcomes(outcomes)
    assert (summary["requests"], summary["ok"], summary["errors"], summary["lost"]) == (4, 2, 1, 1)
    assert summary["seconds"] == 2.0
    assert summary["requests_per_second"] == 1.0 and summary["tokens_per_second"] == 20.0
    assert summary["steady_requests_per_second"] == 1.0  # one answer ends in the second second
    assert summary["steady_tokens_per_second"] == 30.0
    assert summary["latency"]["p50"] == 0.5


def test_ratios_check_the_targets_from_one_run():
    def row(name, rps, p50=0.1, p99=0.15, recompiles=0.0, lost=0):
        return {
            "contender": name,
            "archive": name,
            "workers": 1,
            "steady_requests_per_second": rps,
            "latency": {"p50": p50, "p99": p99},
            "recompiles_after_ready": recompiles,
            "lost": lost,
        }

    rows = [row("ours-auto", 60), row("ours-float32", 30, p99=0.3), row("eager-longest", 20), row("stock", 10)]
    checks = {check["check"]: check for check in ratios(rows)}
    assert checks["ours-auto / stock steady req/s"]["value"] == 6 and checks["ours-auto / stock steady req/s"]["met"]
    assert checks["ours-float32 / eager-longest steady req/s"]["value"] == 1.5
    assert not checks["ours-float32 p99 / p50"]["met"]
    assert checks["lost requests, all contenders"]["met"]


def test_more_workers_are_checked_by_their_median_over_rounds_against_one():
    rows = [
        {"archive": "ours-auto", "workers": workers, "steady_requests_per_second": rps}
        for workers, rps in [(1, 50), (2, 49), (1, 60), (2, 10), (1, 40), (2, 48)]
    ]
    (check,) = worker_checks(rows)
    assert check["check"] == "ours-auto 2 workers / 1, median steady req/s"
    assert check["value"] == 48 / 50 and check["met"]
    assert worker_checks(rows[:1]) == []


def test_ours_is_checked_against_infinity_s_best_configuration_of_the_run():
    from ts_compiled_handlers.benchmarks.loadtest import infinity_checks

    medians = {("ours-auto", 1): 130.0, ("infinity-float32", 1): 80.0, ("infinity-bfloat16-compile", 1): 100.0}
    (check,) = infinity_checks(medians)
    assert "infinity-bfloat16-compile" in check["check"] and check["value"] == pytest.approx(1.3) and check["met"]
    assert infinity_checks({("ours-auto", 1): 130.0}) == []


def test_ours_is_checked_against_vllms_better_configuration_and_its_lone_query(tmp_path):
    from ts_compiled_handlers.benchmarks.loadtest import vllm_checks

    medians = {("ours-auto", 1): 150.0, ("vllm-cpu", 1): 90.0, ("vllm-cpu-tuned", 1): 100.0}
    rows = [
        {"archive": name, "workers": 1, "latency": {"p50": p50}}
        for name, p50 in [("ours-auto", 0.012), ("vllm-cpu", 0.016), ("vllm-cpu-tuned", 0.015)]
    ]
    (throughput,) = vllm_checks(medians, rows, clients=16)
    assert "vllm-cpu-tuned" in throughput["check"] and throughput["value"] == pytest.approx(1.5) and throughput["met"]
    _, lone = vllm_checks(medians, rows, clients=1)
    assert "vllm-cpu-tuned" in lone["check"] and lone["value"] == pytest.approx(0.8) and not lone["met"]
    assert vllm_checks({("ours-auto", 1): 1.0}, rows, 1) == []


def test_a_vllm_contender_is_its_openai_pooling_server_at_bfloat16_defaults_or_tuned(tmp_path):
    from ts_compiled_handlers.benchmarks.vllm_server import TUNED_BATCHED_TOKENS, VllmServer

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "lib" / "python3.11" / "site-packages" / "vllm").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages" / "vllm" / "__init__.py").write_text("")  # installed
    plain = VllmServer("vllm-cpu", tmp_path / "model", 7997, tmp_path, venv)
    command = plain.command()
    assert command[:3] == [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--runner") + 1] == "pooling" and command[command.index("--dtype") + 1] == "bfloat16"
    assert command[command.index("--host") + 1] == "127.0.0.1" and "--max-num-batched-tokens" not in command
    assert "VLLM_CPU_OMP_THREADS_BIND" not in plain.environment() and plain.path == "/v1/embeddings"
    tuned = VllmServer("vllm-cpu-tuned", tmp_path / "model", 7997, tmp_path, venv)
    command = tuned.command()
    assert command[command.index("--max-num-batched-tokens") + 1] == str(TUNED_BATCHED_TOKENS)
    assert tuned.environment()["VLLM_CPU_OMP_THREADS_BIND"].startswith("0-")
    assert tuned.environment()["HF_HUB_OFFLINE"] == "1"


def test_a_vllm_server_answering_other_vectors_is_refused_before_timing(tiny_bert, tmp_path, monkeypatch):
    """The check reads sentence-transformers' `encode` of the same folder: its own vectors pass, noise fails."""
    import torch
    from sentence_transformers import SentenceTransformer

    from ts_compiled_handlers.benchmarks.vllm_server import VllmServer, check

    texts = ["a cat sat on the mat", "hello world"]
    wanted = SentenceTransformer(str(tiny_bert), device="cpu").encode(texts, convert_to_tensor=True)
    server = VllmServer("vllm-cpu", tiny_bert, 7997, tmp_path, tmp_path / "venv")
    answers = dict(zip(texts, wanted.tolist(), strict=True))
    monkeypatch.setattr(server, "embedding", lambda text: answers[text])
    assert check(server, tiny_bert, texts) >= 0.9999
    monkeypatch.setattr(server, "embedding", lambda text: torch.randn(wanted.shape[1]).tolist())
    with pytest.raises(ValueError, match="answers other vectors than sentence-transformers"):
        check(server, tiny_bert, texts)


def test_an_infinity_contender_is_its_torch_engine_at_its_dtype_with_or_without_compile(tmp_path):
    from ts_compiled_handlers.benchmarks.infinity_server import InfinityServer

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "infinity_emb").write_text("")  # an installed venv: nothing is installed
    server = InfinityServer("infinity-bfloat16-compile", tmp_path / "model", 7997, tmp_path, venv)
    command = server.command()
    assert command[:2] == [str(venv / "bin" / "infinity_emb"), "v2"]
    assert command[command.index("--dtype") + 1] == "bfloat16" and "--compile" in command
    assert command[command.index("--engine") + 1] == "torch" and command[command.index("--host") + 1] == "127.0.0.1"
    plain = InfinityServer("infinity-float32", tmp_path / "model", 7997, tmp_path, venv).command()
    assert plain[plain.index("--dtype") + 1] == "float32" and "--no-compile" in plain


@pytest.mark.heavy  # starts a process
def test_infinity_starts_with_the_allocator_the_torchserve_contenders_get(tmp_path, monkeypatch):
    from ts_compiled_handlers.benchmarks.infinity_server import InfinityServer
    from ts_compiled_handlers.runtime import allocator

    library = tmp_path / "libtcmalloc_minimal.so.4"
    library.write_bytes(b"")  # preloaded by nothing: the stand-in only writes down what it was given
    monkeypatch.setattr(allocator, "find", lambda dirs=None: library)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("HFSERVE_ALLOCATOR", raising=False)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stand_in = venv / "bin" / "infinity_emb"
    stand_in.write_text(f'#!/bin/sh\nprintf "%s" "$LD_PRELOAD" > {tmp_path / "seen"}\n')
    stand_in.chmod(0o755)
    with pytest.raises(RuntimeError, match="infinity-float32 exited"):
        InfinityServer("infinity-float32", tmp_path / "model", 7997, tmp_path, venv).start()
    assert (tmp_path / "seen").read_text() == str(library)


def test_open_loop_arrivals_are_a_seeded_poisson_process_of_the_rate():
    gaps = [later - earlier for earlier, later in itertools.pairwise(itertools.islice(arrivals(200.0, 5.0), 20001))]
    assert all(gap > 0 for gap in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 200, rel=0.03)
    assert sorted(gaps)[len(gaps) // 2] == pytest.approx(0.693 / 200, rel=0.05)  # exponential: median ln 2 / rate
    assert list(itertools.islice(arrivals(200.0, 5.0), 5)) == list(itertools.islice(arrivals(200.0, 5.0), 5))


class SlowAnswer(BaseHTTPRequestHandler):
    """Answers every POST after SECONDS: a server that serves one request at a time per connection."""

    SECONDS = 0.05

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(self.SECONDS)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowAnswer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/predict"
    server.shutdown()
    server.server_close()


def test_open_loop_sends_every_arrival_of_the_run_and_counts_latency_from_the_arrival(slow_server):
    """40 requests/s arriving at one client that is busy 50 ms with each: the arrivals queue, and a
    request's latency includes its wait for the client, as a user's would."""
    rate, duration = 40.0, 1.0
    due = list(itertools.takewhile(lambda at: at < duration, arrivals(rate, 0.0)))
    outcomes = drive_url(slow_server, {}, str.encode, [("text", 3)], 1, duration, rate)
    assert len(outcomes) == len(due) and all(outcome.status == 200 for outcome in outcomes)
    sent = sorted(outcome.sent for outcome in outcomes)
    assert [at - sent[0] for at in sent] == pytest.approx([at - due[0] for at in due], abs=1e-6)
    finished = least = 0.0  # one client with no overhead: the least the slowest latency can be (0.63 s here)
    for at in due:
        finished = max(finished, at) + SlowAnswer.SECONDS
        least = max(least, finished - at)
    assert max(outcome.seconds for outcome in outcomes) >= least - 1e-6 > 10 * SlowAnswer.SECONDS
    closed = drive_url(slow_server, {}, str.encode, [("text", 3)], 2, 0.3)  # closed loop: no queue of its own
    assert closed and all(outcome.status == 200 for outcome in closed)


def test_the_image_mix_sends_a_quarter_pictures_the_same_for_every_contender():
    import io

    from PIL import Image

    from ts_compiled_handlers.benchmarks.loadtest_images import body

    texts = [f"text number {index}" for index in range(400)]
    bodies = [body(text) for text in texts]
    pictures = [data for data, kind in bodies if kind == "image/jpeg"]
    assert 70 <= len(pictures) <= 130 and bodies == [body(text) for text in texts]
    assert len(set(pictures)) == 8 and Image.open(io.BytesIO(pictures[0])).size == (320, 240)
    assert all(data == text.encode() for (data, kind), text in zip(bodies, texts, strict=True) if kind != "image/jpeg")
