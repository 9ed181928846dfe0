"""Fuzzing through a real TorchServe: generated hostile bodies sent concurrently among ordinary
requests, for every task. Every hostile request must get a 4xx or a 200, every ordinary one a 200
equal to its answer alone, and the worker must neither die nor restart.

    pytest tests/integration/test_fuzz_server.py --fuzz-requests 5000   # the longer run of docs/operations.md
"""

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from archives import TASK_ARCHIVES
from fuzzing import Case, hostile_cases, ordinary
from parity import assert_same_answers

pytestmark = pytest.mark.integration

ORDINARY = ["alice walks to paris quickly", "the cat sat on the red mat in berlin", "hello"]
ORDINARY_EVERY = 3  # one ordinary request among every three sent
CLIENTS = 8  # twice the batch size: batches fill with hostile and ordinary requests alike
SECONDS_PER_REQUEST = 0.5  # the run's bound: far above what a request takes, so hitting it is a failure


@pytest.fixture(scope="module")
def server(task_server):
    return task_server


def send(server, name: str, case: Case) -> requests.Response:
    path = f"v2/models/{name}/infer" if case.v2 else f"predictions/{name}"
    if case.route:
        path = f"predictions/{name}/1.0/{case.route}"
    headers = {**server.headers("inference"), "Content-Type": case.content_type}
    return requests.post(f"{server.inference_url}/{path}", data=case.body, headers=headers, timeout=120)


def frontend_form_error(item: Case | str, response: requests.Response) -> bool:
    """TorchServe's frontend decodes an application/x-www-form-urlencoded body itself (Netty's
    HttpPostRequestDecoder) and answers 500 to one it cannot decode, before any worker sees it:
    outside the handler's reach, counted apart instead of failing the run."""
    if isinstance(item, str) or item.content_type != "application/x-www-form-urlencoded":
        return False
    try:
        return response.status_code == 500 and response.json().get("type") == "ErrorDataDecoderException"
    except ValueError:
        return False


FUZZED = {**TASK_ARCHIVES, "colbert": "multi-vector", "m3": "m3-embedding"}  # archive name: task


@pytest.mark.parametrize("name", FUZZED)
def test_generated_hostile_requests_get_4xx_or_200_and_spoil_nothing(server, name, request):
    task, count = FUZZED[name], request.config.getoption("--fuzz-requests")
    pids = server.worker_pids(name)
    alone = {text: server.predict(name, ordinary(task, text)).json() for text in ORDINARY}
    plan: list[Case | str] = []
    for position, case in enumerate(hostile_cases(task, request.config.getoption("--fuzz-seed"), count, name)):
        plan.append(case)
        if position % (ORDINARY_EVERY - 1) == 1:
            plan.append(ORDINARY[position % len(ORDINARY)])
    deadline = time.monotonic() + 60 + SECONDS_PER_REQUEST * len(plan)

    def one(item: Case | str):
        if time.monotonic() > deadline:
            return item, None
        if isinstance(item, str):
            return item, server.predict(name, ordinary(task, item))
        return item, send(server, name, item)

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(one, plan))

    unsent = sum(response is None for _, response in results)
    assert unsent == 0, f"{unsent} of {len(plan)} requests not sent within the run's bound"
    frontend = [item for item, response in results if frontend_form_error(item, response)]
    failures = [
        f"{response.status_code} for {item}"
        for item, response in results
        if response.status_code >= 500 and item not in frontend
    ]
    assert not failures, "server errors:\n" + "\n".join(failures[:20])
    for item, response in results:  # a refusal on an OpenAI path is in OpenAI's error shape
        served = task != "token-classification"  # its v1/ path is one it does not serve: a plain 404
        if served and isinstance(item, Case) and item.route.startswith("v1/") and response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}, f"{item}: {response.text}"
    for item, response in results:
        if isinstance(item, str):
            assert response.status_code == 200, response.text
            assert_same_answers(response.json(), alone[item], tolerance=1e-5)
    generated = Counter(response.status_code for item, response in results if not isinstance(item, str))
    ordinary_ok = sum(isinstance(item, str) for item, _ in results)
    print(
        f"\n{name}: {count} generated: {dict(sorted(generated.items()))} ({len(frontend)} 500s from TorchServe's "
        f"form decoder); {ordinary_ok} ordinary: all 200, as alone"
    )
    assert server.worker_pids(name) == pids
    assert server.ping().status_code == 200
