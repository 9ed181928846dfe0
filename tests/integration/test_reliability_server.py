"""Hostile input, faults, overload, security and metrics through one real TorchServe on loopback.

Models (the tiny random BERT, one small grid):
- guarded: an AOT package (`--precompile aot`), `overflow: reject`, at most 4 texts per request,
  scheduled by tokens in the worker (`asyncCommunication: true`);
- truncating: compiled, over-long texts truncated (the default), TorchServe's request batches;
- broken: tests/fault_handlers/broken_compiler.py, inductor fails, `on_failure: eager`;
- slow: tests/fault_handlers/slow.py, `sleep <s>` texts hold the worker; job queue of 2, responseTimeout 3 s;
- slow_call: tests/fault_handlers/slow_call.py, `sleep <s>` texts hold the model call, scheduled,
  `scheduler.max_queue: 2`.
The host compile cache is on (a folder of this module), so a restarted worker starts warm.
The worker kills run last: they restart `guarded` and `truncating`.
"""

import json
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
import server_logs
import torch
from fuzzing import nested_lists

from ts_compiled_handlers.benchmarks.soak import INVALID_REQUESTS, soak
from ts_compiled_handlers.scripts.build_mar import build
from ts_compiled_handlers.scripts.serve import RegistrationError, TorchServe

pytestmark = pytest.mark.integration

FAULTS = Path(__file__).parents[1] / "fault_handlers"
GRID = {"dtype": "float32", "buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}}
CANARY = "CANARY-7f3a9c-do-not-log"
SCHEDULED = {"asyncCommunication": True}
GUARDED = {**GRID, "max_inputs": 4, "buckets": {**GRID["buckets"], "overflow": "reject"}}
RETRY_SECONDS = 55  # guarded's maxRetryTimeoutInSec: how long /ping trusts a restarted worker
HELD_SECONDS = 35  # the kill test's client timeout: past a restart (25.1 s in a busy CI run), under RETRY_SECONDS
ARCHIVES = {  # name: (handler file or None, model-config over the defaults); guarded is precompiled
    "guarded": (None, {**SCHEDULED, "maxRetryTimeoutInSec": RETRY_SECONDS, "handler": GUARDED}),
    "truncating": (None, {"handler": GRID}),
    "broken": (FAULTS / "broken_compiler.py", {"handler": GRID}),
    "broken_fail": (FAULTS / "broken_compiler.py", {"handler": {**GRID, "compile": {"on_failure": "fail"}}}),
    "slow": (
        FAULTS / "slow.py",
        {"jobQueueSize": 2, "responseTimeout": 3, "handler": {**GRID, "compile": {"enable": False}}},
    ),
    "slow_call": (
        FAULTS / "slow_call.py",
        {**SCHEDULED, "handler": {**GRID, "compile": {"enable": False}, "scheduler": {"max_queue": 2}}},
    ),
}
# TorchServe batch size and delay at registration (None: the archive's: 1 for the scheduled ones)
BATCHING = {
    "guarded": (None, None),
    "truncating": (4, 50),
    "broken": (4, 50),
    "slow": (1, 1),
    "slow_call": (None, None),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_bert):
    store = tmp_path_factory.mktemp("model_store")
    for name, (handler, extra) in ARCHIVES.items():
        precompile = "aot" if name == "guarded" else None
        build(tiny_bert, "embedding", name, store, extra, handler_file=handler, precompile=precompile)
    cache = {"HFSERVE_CACHE_DIR": str(tmp_path_factory.mktemp("host-compile-cache"))}
    torchserve = TorchServe.on_free_ports(tmp_path_factory.mktemp("torchserve"), store, env=cache)
    torchserve.start()
    try:
        # All at once: their workers' start-ups (interpreter, imports, model load) overlap.
        with ThreadPoolExecutor(len(BATCHING)) as pool:
            registering = [
                pool.submit(torchserve.register, f"{name}.mar", batch_size=size, max_batch_delay=delay, workers=1)
                for name, (size, delay) in BATCHING.items()
            ]
            for registration in registering:
                registration.result()
        yield torchserve
    finally:
        torchserve.stop()


def log_text(server, name: str) -> str:
    return server_logs.log_text(server.workdir, name)


def embedding(response) -> torch.Tensor:
    assert response.status_code == 200, response.text
    return torch.tensor(response.json()["embedding"])


# -- bad input -------------------------------------------------------------------------------
BAD_REQUESTS = [  # (body, content type, status, what the error says)
    *[(body, kind, 400, None) for body, kind in INVALID_REQUESTS],
    (b'["a", "b"]', "application/json", 400, "must be an object"),
    (b'{"inputs": ""}', "application/json", 400, "'inputs'[0] is empty"),
    (json.dumps({"inputs": ["a"] * 5}).encode(), "application/json", 413, "at most 4"),
    (json.dumps({"inputs": "word " * 40}).encode(), "application/json", 413, "longer than 32 tokens"),
    (json.dumps({"inputs": "x", "normalize": "yes"}).encode(), "application/json", 400, "true or false"),
]


@pytest.mark.parametrize("body, content_type, status, fragment", BAD_REQUESTS)
def test_each_bad_request_gets_its_own_4xx_json_and_the_worker_stays_up(server, body, content_type, status, fragment):
    response = server.predict("guarded", body, content_type=content_type)
    assert response.status_code == status
    answer = response.json()
    assert set(answer) == {"error", "code"} and answer["code"] == status
    assert fragment is None or fragment in answer["error"]
    assert server.ping().status_code == 200
    assert server.predict("guarded", {"inputs": "hello world"}).status_code == 200


def test_a_body_over_max_request_size_is_refused_by_torchserve(server):
    response = server.predict("guarded", b"x" * 7_000_000, content_type="text/plain")
    assert response.status_code == 413
    assert server.ping().status_code == 200


def test_overlong_text_is_truncated_to_the_largest_bucket(server):
    words = "the cat sat on the mat " * 10  # 60 tokens, beyond the 32-token bucket
    longer = server.predict("truncating", {"inputs": words * 2})
    assert torch.allclose(embedding(longer), embedding(server.predict("truncating", {"inputs": words})))


@pytest.mark.parametrize("name", ["guarded", "truncating"])  # scheduled by tokens; request batches
def test_one_bad_request_in_a_batch_does_not_spoil_the_others(server, name):
    texts = [f"alice sees {i} red houses by the river" for i in range(12)]
    alone = [embedding(server.predict(name, {"inputs": text})) for text in texts]
    bodies = [{"inputs": text} for text in texts]
    bodies[3], bodies[8] = {"inputs": ""}, {"inputs": "x", "bogus": True}
    with ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(lambda body: server.predict(name, body), bodies))
    assert [r.status_code for r in responses] == [200] * 3 + [400] + [200] * 4 + [400] + [200] * 3
    for index, response in enumerate(responses):
        if index not in (3, 8):
            assert torch.allclose(embedding(response), alone[index], atol=1e-5)


def test_hostile_bodies_in_a_batch_fail_alone_and_the_worker_keeps_its_pid_and_memory(server):
    """A tokenize body of ~325k tokens (its answer once passed TorchServe's max_response_size, and the
    frontend dropped the worker with its whole batch) and nested lists by the megabyte (~21x their
    size once decoded), sent among ordinary requests of the same batches: each hostile one gets its
    4xx, the others their own answers, from the same worker, whose memory stays bounded."""
    name = "truncating"  # request batches of 4 within 50 ms
    (pid,) = server.worker_pids(name)
    before = psutil.Process(pid).memory_info().rss
    texts = [f"alice sees {i} red houses by the river" for i in range(6)]
    alone = [embedding(server.predict(name, {"inputs": text})) for text in texts]
    url = f"{server.inference_url}/predictions/{name}/1.0"
    headers = {**server.headers("inference"), "Content-Type": "application/json"}
    hostile = [
        ("tokenize", json.dumps({"inputs": "a " * 325_000}).encode()),
        ("", nested_lists(1.0)),
        ("", nested_lists(1.0, wrapped=True)),
    ] * 2
    sent = [("", json.dumps({"inputs": text}).encode()) for text in texts]
    mixed = [request for pair in zip(hostile, sent, strict=True) for request in pair]

    def post(request):
        route, body = request
        return requests.post(f"{url}/{route}" if route else url, data=body, headers=headers, timeout=120)

    with ThreadPoolExecutor(len(mixed)) as pool:
        responses = list(pool.map(post, mixed))
    for index, response in enumerate(responses):
        if index % 2 == 0:
            assert 400 <= response.status_code < 500 and "error" in response.json(), response.text[:300]
        else:
            assert torch.allclose(embedding(response), alone[index // 2], atol=1e-5)
    assert server.worker_pids(name) == [pid]
    grown = psutil.Process(pid).memory_info().rss - before
    assert grown < 100 * 2**20, f"the worker grew by {grown / 2**20:.0f} MiB"


# -- compile failures ------------------------------------------------------------------------
def test_a_compile_failure_with_on_failure_eager_serves_eagerly_and_says_so(server):
    from fault_handlers.broken_compiler import INJECTED  # tests/ is on sys.path (conftest)

    text = "hello world, the fast model"
    assert torch.allclose(
        embedding(server.predict("broken", {"inputs": text})),
        embedding(server.predict("truncating", {"inputs": text})),
        atol=1e-5,
    )
    log = log_text(server, "model_log.log")
    eager = r"broken_1\.0-stdout MODEL_LOG - Serving the model EAGERLY \(compilation off\): compile_error: "
    assert re.search(eager, log)
    assert INJECTED in log
    # the ready line says why, without the traceback (inductor's error, unwrapped)
    ready = re.search(r"broken_1\.0-stdout MODEL_LOG - Ready in \S+ from eager \((.*?)\): ", log)
    assert ready and ready[1] == f"compile_error: RuntimeError: {INJECTED}"


def test_a_compile_failure_with_on_failure_fail_refuses_the_registration_fast(server):
    from fault_handlers.broken_compiler import INJECTED

    began = time.monotonic()
    with pytest.raises(RegistrationError) as refused:
        server.register("broken_fail.mar", workers=1)
    assert "on_failure=fail" in str(refused.value) and INJECTED in str(refused.value)
    assert time.monotonic() - began < 90  # one attempt (~15 s here), not TorchServe's retries for minutes
    time.sleep(3)  # time for a retry to show in the log, had TorchServe scheduled one
    # ts_log.log has each line twice (two appenders): count distinct start lines, timestamp included.
    starts = re.findall(
        r"^.*W-\d+-broken_fail_1\.0 \S+WorkerLifeCycle - Worker cmdline", log_text(server, "ts_log.log"), re.M
    )
    assert len(set(starts)) == 1


# -- overload and timeouts -------------------------------------------------------------------
def test_past_the_job_queue_the_surplus_gets_503_and_every_accepted_request_an_answer(server):
    sent = time.monotonic()

    def call(_):
        response = server.predict("slow", {"inputs": "sleep 0.5"})
        return response.status_code, time.monotonic() - sent

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(call, range(12)))
    codes = [code for code, _ in results]
    assert set(codes) == {200, 503} and codes.count(200) >= 3  # one running + a queue of two
    refused = [seconds for code, seconds in results if code == 503]
    assert max(refused) < max(seconds for code, seconds in results if code == 200)  # not held in line


def test_past_the_schedulers_queue_the_surplus_gets_503_json_at_once_and_the_held_ones_an_answer(server):
    sent = time.monotonic()

    def call(_):
        response = server.predict("slow_call", {"inputs": "sleep 0.5"})
        return response.status_code, response.json(), time.monotonic() - sent

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(call, range(10)))
    codes = [code for code, _, _ in results]
    assert set(codes) == {200, 503} and codes.count(200) >= 2  # the queue holds two (max_queue)
    refused = [(body, seconds) for code, body, seconds in results if code == 503]
    assert all(body["code"] == 503 and "max_queue" in body["error"] for body, _ in refused)
    assert max(seconds for _, seconds in refused) < 0.5  # refused at once, not after a call
    assert server.predict("slow_call", {"inputs": "hello"}).status_code == 200


def test_a_request_past_response_timeout_gets_an_error_and_the_worker_comes_back(server):
    response = server.predict("slow", {"inputs": "sleep 10"})
    assert response.status_code >= 500
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.predict("slow", {"inputs": "hello"}).status_code == 200:
            break
        time.sleep(1)
    else:
        pytest.fail("the slow model never answered again after its response timeout")
    assert server.ping().status_code == 200


# -- security --------------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["inference", "management"])
@pytest.mark.parametrize("authorization", [None, "Bearer not-the-token"])
def test_requests_without_the_right_token_are_refused(server, api, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    url = f"{server.inference_url}/predictions/guarded" if api == "inference" else f"{server.management_url}/models"
    call = requests.post if api == "inference" else requests.get
    response = call(url, json={"inputs": "x"}, headers=headers, timeout=10)
    assert response.status_code in (400, 401) and "token" in response.text.lower()  # 400: none, 401: wrong


def test_models_from_outside_the_model_store_are_refused(server, tmp_path):
    outside = tmp_path / "elsewhere.mar"
    shutil.copy(server.model_store / "truncating.mar", outside)
    for url in (f"file://{outside}", "https://example.com/model.mar"):
        response = requests.post(
            f"{server.management_url}/models", params={"url": url}, headers=server.headers("management"), timeout=30
        )
        assert 400 <= response.status_code < 500 and "url" in response.text.lower(), url
    assert "can access any URL" not in log_text(server, "ts_log.log")


def test_request_text_is_never_logged_nor_echoed_back(server):
    bodies = [
        {"inputs": CANARY},
        {"inputs": [CANARY, 7]},
        {"inputs": CANARY, CANARY: 1},
        {"inputs": f"{CANARY} " * 40},
        f'{{"inputs": "{CANARY}"'.encode(),
    ]
    served = len(re.findall("/predictions/guarded", log_text(server, "access_log.log")))
    for body in bodies:
        assert CANARY not in server.predict("guarded", body).text
    # The access log's line for the last request is written after the worker's lines about it.
    wait_for(
        lambda: len(re.findall("/predictions/guarded", log_text(server, "access_log.log"))) >= served + len(bodies),
        30,
        "the access log's lines for the canary requests",
    )
    for log in (server.workdir / "logs").glob("*.log"):
        assert CANARY not in log.read_text(errors="replace"), log.name


# -- observability ---------------------------------------------------------------------------
def test_the_logs_keep_every_file_but_no_lines_per_request(server):
    """The package's log4j2.xml (config.properties' vmargs): requests leave one access-log line
    each, and nothing in ts_log.log or model_log.log; the ready lines and start-up stay."""
    before = {name: log_text(server, name) for name in ("ts_log.log", "model_log.log")}
    served = len(re.findall("/predictions/guarded", log_text(server, "access_log.log")))
    for _ in range(5):
        assert server.predict("guarded", {"inputs": ["a cat", "a dog"]}).status_code == 200
    wait_for(
        lambda: len(re.findall("/predictions/guarded", log_text(server, "access_log.log"))) >= served + 5,
        30,
        "the access log's lines for the requests",
    )
    assert "-Dlog4j.configurationFile=" in (server.workdir / "config.properties").read_text()
    ts_log, model_log = log_text(server, "ts_log.log"), log_text(server, "model_log.log")
    for per_request in ("Backend response time", "Looping backend response", "pattern=[METRICS]", "Flushing req"):
        assert per_request not in ts_log, per_request
    assert "Backend received inference at" not in model_log
    assert ts_log.startswith(before["ts_log.log"]) and len(ts_log) == len(before["ts_log.log"])
    assert "Ready in" in model_log and "Worker loaded the model successfully" in ts_log


def metric(text: str, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for found_labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.MULTILINE):
        if all(f'{key}="{wanted}"' in found_labels for key, wanted in labels.items()):
            total += float(value)
    return total


def test_prometheus_metrics_show_compile_state_and_requests_per_bucket(server):
    before = server.metrics()
    assert server.predict("truncating", {"inputs": ["a cat", "a dog", "a mat"]}).status_code == 200
    assert server.predict("truncating", {"inputs": "the cat sat on the mat " * 3}).status_code == 200

    # Packed: the three 4-token texts share one row (12 tokens, the 32 bucket), the 20-token one has its own.
    def added(text: str) -> float:
        return metric(text, "BucketRequests", ModelName="truncating", Bucket="packed 1x32") - metric(
            before, "BucketRequests", ModelName="truncating", Bucket="packed 1x32"
        )

    after = server_logs.metrics_after(server, lambda text: added(text) >= 4)
    assert added(after) == 4
    assert metric(after, "CompileFallback", ModelName="broken") == 1
    assert metric(after, "CompileFallback", ModelName="truncating") == 0
    # the reason it serves eagerly: inductor failed on the model, not for want of a C++ compiler
    assert metric(after, "EagerFallbacks", ModelName="broken", Reason="compile_error") == 1
    assert metric(after, "EagerFallbacks", ModelName="truncating") == 0
    assert metric(after, "AotPackage", ModelName="guarded") == 1
    assert metric(after, "AotPackage", ModelName="truncating") == 0
    for name in ("CompileSeconds", "WarmupSeconds", "PaddedTokenRatio"):
        assert metric(after, name, ModelName="truncating") > 0, name
    assert metric(after, "RecompilesAfterReady", ModelName="truncating") == 0


def ready_lines(server, name: str) -> list[str]:
    lines = [line for line in log_text(server, "model_log.log").splitlines() if f"{name}_1.0-stdout" in line]
    return [line for line in lines if "MODEL_LOG - Ready in" in line]


def test_one_ready_line_per_worker_says_what_it_runs(server):
    compiled, packaged = ready_lines(server, "truncating"), ready_lines(server, "guarded")
    assert len(compiled) == len(packaged) == 1
    grid = r"dtype float32, compiled=True mode=default .*lengths \[8, 32\] x batches \[1, 4\], {} graphs, "
    grid += r"model load [\d.]+s, "
    timings = r"first pass over the grid [\d.]+s, warm-up [\d.]+s, \d+ threads \(live workers: 1, \d+ cores.*\), "
    timings += "compile cache: "
    assert re.search(r"Ready in [\d.]+s from compiled: cpu, .*" + grid.format(1) + timings, compiled[0])
    aot_package = r"Ready in [\d.]+s from aot package: cpu, .*" + grid.format(0) + timings + "not needed"
    assert re.search(aot_package, packaged[0])


# -- load, then workers killed under it (last: they restart `truncating` and `guarded`) ------
SHORT_TEXTS = [f"alice walks to paris {i} times with bob" for i in range(50)]


def test_soak_with_invalid_requests_loses_nothing_and_keeps_memory_flat(server):
    result = soak(server, "truncating", SHORT_TEXTS, clients=4, duration=5, invalid_every=4)
    assert result["invalid"] > 0 and result["no_answer"] == result["server_errors"] == 0
    assert result["client_errors"] == result["invalid"] and result["wrong_answers"] == 0
    assert result["rss_end_mb"] < result["rss_start_mb"] * 1.2


def recovery(result: dict) -> float:
    """The seconds from the kill to the first answer after it; a clear failure where there is none."""
    assert result["killed_pid"] is not None, f"soak found no READY worker to kill: {result}"
    assert result["recovery_seconds"] is not None, (
        f"worker {result['killed_pid']} killed: no request sent after the kill was answered before the run ended "
        f"({result['ok']} answered, {result['no_answer']} unanswered, {result['server_errors']} 5xx)"
    )
    print(f"worker {result['killed_pid']} killed: answering again after {result['recovery_seconds']:.1f} s")
    return result["recovery_seconds"]


def test_a_worker_killed_under_load_fails_only_its_batch_and_comes_back_warm(server):
    result = soak(server, "truncating", SHORT_TEXTS, clients=8, duration=120, invalid_every=0, kill_after=2)
    recovery(result)
    assert result["no_answer"] == 0 and result["server_errors"] <= BATCHING["truncating"][0]
    assert result["ok"] == result["requests"] - result["server_errors"]
    ready = ready_lines(server, "truncating")
    assert len(ready) == 2 and "from host cache" in ready[-1]


def wait_for(event, seconds: float, what: str):
    """`event()`'s first true value, polled until `seconds` have passed; fails saying `what` never happened."""
    deadline = time.monotonic() + seconds
    while not (value := event()):
        assert time.monotonic() < deadline, f"{what}: not within {seconds:.0f} s"
        time.sleep(0.25)
    return value


def fresh_scheduled_worker(server, name: str) -> int:
    """Scale `name` to 0 workers and back to 1, and wait for the new worker to be READY with its ready
    line logged; returns the ready lines it has then. TorchServe 0.12 keeps an async worker's thread
    across restarts and never marks a restarted one loaded again (AsyncWorkerThread.loadingFinished),
    so after any earlier death of its worker the model's worker is never READY (nothing for the kill
    to find) and its recovery clock is never reset (a second death past maxRetryTimeoutInSec is not
    retried); a new worker thread starts clean, whatever earlier tests left."""
    server.scale(name, 0)
    before = len(ready_lines(server, name))
    server.scale(name, 1)
    wait_for(lambda: server.worker_pids(name), 120, f"a READY {name} worker after scaling to 0 and back")
    wait_for(lambda: len(ready_lines(server, name)) > before, 30, f"the ready line of the new {name} worker")
    return len(ready_lines(server, name))


def test_a_scheduled_worker_killed_under_load_loses_only_what_it_held_and_comes_back_from_its_package(server):
    ready_before = fresh_scheduled_worker(server, "guarded")
    assert server.ping().status_code == 200, "/ping is not 200 before the kill: another model is unhealthy"
    # TorchServe 0.12 neither answers nor retries the requests an async worker held when it died
    # (docs/operations.md): each of the 8 clients has at most one in flight, which times out. And its
    # restarted async worker thread takes the next queued request before the worker has answered
    # LOAD, and fails ("Received more than 1 control command"): it comes back only while nothing is
    # queued. So the clients wait HELD_SECONDS, longer than the restart, before they send again.
    killed_at = time.monotonic() + 2  # no later than the kill: the soak's timer starts after this
    result = soak(
        server, "guarded", SHORT_TEXTS, clients=8, duration=120, invalid_every=0, kill_after=2, timeout=HELD_SECONDS
    )
    recovery(result)
    assert result["no_answer"] <= 8 and result["server_errors"] == 0
    assert result["ok"] == result["requests"] - result["no_answer"]
    wait_for(lambda: len(ready_lines(server, "guarded")) > ready_before, 30, "the restarted worker's ready line")
    ready = ready_lines(server, "guarded")
    assert len(ready) == ready_before + 1 and "from aot package" in ready[-1]
    # The restarted worker serves, and /ping says so until maxRetryTimeoutInSec after the kill;
    # then TorchServe reports it unhealthy (it never marks a restarted async worker loaded), until
    # the model is scaled to 0 workers and back.
    assert time.monotonic() < killed_at + RETRY_SECONDS and server.ping().status_code == 200
    wait_for(
        lambda: server.ping().status_code == 500, RETRY_SECONDS + 30, "/ping turning 500 after maxRetryTimeoutInSec"
    )
    assert time.monotonic() >= killed_at + RETRY_SECONDS, "/ping turned 500 before maxRetryTimeoutInSec"
    assert server.predict("guarded", {"inputs": "hello"}).status_code == 200
    assert server.ping().status_code == 500
    server.scale("guarded", 0)
    server.scale("guarded", 1)
    assert server.ping().status_code == 200 and server.predict("guarded", {"inputs": "hello"}).status_code == 200
