"""The same archives on Ray (handlers/servers/ray/serve.py, handlers/servers/ray/data.py), through a real Ray cluster
of two nodes on this host (`ray.cluster_utils.Cluster`: a head and a worker node, one logical CPU
each; a third joins for the node test), shared by every test of the module, in this order:

- MiniLM's AOT archive, 2 replicas on 2 nodes: answers, keys, errors, metrics;
- a replica killed under load, a node removed: the others answer, the replica comes back;
- tiny archives of every task, and the fuzz test's hostile bodies against TorchServe's answers;
- autoscaling from 1 replica to 2 and back;
- Ray Data, after the Serve applications are gone: 2,000 texts, and `hfserve embed-corpus`.
"""

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import flag_reference
import numpy as np
import openai
import pytest
import requests
import torch
from archives import SMALL_GRID
from fuzzing import hostile_cases
from parity import assert_same_answers, generate_alone
from pylate_reference import REFERENCE, assert_equal_vectors, checked_model
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import quantize_embeddings
from transformers import pipeline

from ts_compiled_handlers.scripts.build_mar import build
from ts_compiled_handlers.scripts.serve import free_ports

ray = pytest.importorskip("ray", reason="the ray extra: pip install 'ts-compiled-handlers[ray]'")
from ray import serve  # noqa: E402
from ray._private import state  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from ts_compiled_handlers.servers.ray.serve import KEY_ENV, app  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.heavy]

KEY = "ray-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXTS = [
    "hello world",
    "Ray Serve answers embedding requests from a compiled model.",
    "Die Katze schläft auf dem Sofa, und der Hund bellt.",
    "word " * 400,  # truncated at the model's limit, as encode does
]
READY_SECONDS = 300


@pytest.fixture(scope="module")
def cluster():
    """A head and a worker node, one CPU each; Serve's HTTP proxy on a free loopback port; the
    applications' key in $HFSERVE_API_KEY, read where each is built (here)."""
    keyed = pytest.MonkeyPatch()
    keyed.setenv(KEY_ENV, KEY)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    context = ray.init(address=cluster.address)
    port = free_ports(1)[0]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    cluster.url = f"http://127.0.0.1:{port}"
    cluster.dashboard_url = context.dashboard_url
    try:
        yield cluster
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        keyed.undo()


@pytest.fixture(scope="module")
def minilm_archive(tmp_path_factory, minilm_dir):
    store = tmp_path_factory.mktemp("ray_store")
    return build(minilm_dir, "embedding", "minilm", store, {"handler": {"dtype": "float32"}}, precompile="aot")


@pytest.fixture(scope="module")
def minilm(cluster, minilm_archive):
    """MiniLM's AOT archive, 2 replicas, at most one per node: so one on each (half a CPU each, so
    that the other tasks' replicas fit beside them on these one-CPU nodes)."""
    options = {"num_replicas": 2, "max_replicas_per_node": 1, "ray_actor_options": {"num_cpus": 0.5}}
    deploy(minilm_archive, "minilm", route_prefix="/", **options)
    return cluster.url


@pytest.fixture(scope="module")
def reference(minilm_dir):
    return SentenceTransformer(str(minilm_dir), device="cpu")


def deploy(archive, app_name: str, route_prefix: str | None = None, **options) -> None:
    """An application of the archive: at "/" (TorchServe's whole surface, /ping included), or at its
    own /predictions/NAME beside others (docs/scale-out.md)."""
    serve.run_many([target(archive, app_name, route_prefix, **options)])


def target(archive, app_name: str, route_prefix: str | None = None, **options) -> serve.RunTarget:
    settings = {"archive": str(archive), **options}  # the key: $HFSERVE_API_KEY (`cluster`)
    return serve.RunTarget(app(settings), name=app_name, route_prefix=route_prefix or f"/predictions/{app_name}")


def replicas(app_name: str) -> list[dict]:
    """The application's live replica actors: pid and node."""
    actors = state.actors().values()
    return [
        {"pid": actor["Pid"], "node": actor["Address"]["NodeID"]}
        for actor in actors
        if actor["ActorClassName"].startswith(f"ServeReplica:{app_name}:") and actor["State"] == "ALIVE"
    ]


def running(app_name: str) -> int:
    status = serve.status().applications.get(app_name)
    return 0 if status is None else sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values())


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.5)


def cosines(got, wanted) -> list[float]:
    return torch.nn.functional.cosine_similarity(torch.tensor(got), torch.as_tensor(wanted), dim=1).tolist()


def embed(base: str, texts: list[str], timeout: float = 60) -> requests.Response:
    return requests.post(f"{base}/predictions/minilm", json={"inputs": texts}, headers=AUTH, timeout=timeout)


class Load:
    """`clients` threads sending short requests until stopped; each result with its send time."""

    def __init__(self, send, clients: int):
        self.results: list[tuple[float, object]] = []
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(send,)) for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def run(self, send) -> None:
        while not self.stopped.is_set():
            sent = time.monotonic()
            try:
                self.results.append((sent, send().status_code))
            except requests.RequestException as error:
                self.results.append((sent, type(error).__name__))

    def stop(self) -> list[tuple[float, object]]:
        self.stopped.set()
        for thread in self.threads:
            thread.join()
        return self.results


# -- MiniLM on two nodes ----------------------------------------------------------------------------
def test_two_replicas_on_two_nodes_answer_as_sentence_transformers(cluster, minilm, reference):
    placed = replicas("minilm")
    assert len(placed) == 2 and len({replica["node"] for replica in placed}) == 2, placed
    base = minilm
    answers = [embed(base, TEXTS) for _ in range(6)]  # both replicas answer some
    wanted = reference.encode(TEXTS)
    for response in answers:
        assert response.status_code == 200, response.text
        assert min(cosines([item["embedding"] for item in response.json()], wanted)) >= 0.9999
        assert int(response.headers["x-prompt-tokens"]) > len(TEXTS)
    client = openai.OpenAI(base_url=f"{base}/predictions/minilm/1.0/v1", api_key=KEY, max_retries=0)
    vectors = client.embeddings.create(model="minilm", input=TEXTS[:3]).data
    assert min(cosines([vector.embedding for vector in vectors], wanted[:3])) >= 0.9999


def test_only_ping_answers_without_the_key(cluster, minilm):
    base = minilm
    assert requests.get(f"{base}/ping", timeout=10).json() == {"status": "Healthy"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = requests.post(f"{base}/predictions/minilm", json={"inputs": "a"}, headers=headers, timeout=10)
        assert response.status_code == 401 and response.json()["type"] == "Unauthorized"
    missing = requests.post(f"{base}/predictions/other", json={"inputs": "a"}, headers=AUTH, timeout=10)
    assert missing.status_code == 404 and missing.json()["type"] == "ModelNotFoundException"
    version = requests.post(f"{base}/predictions/minilm/9.9", json={"inputs": "a"}, headers=AUTH, timeout=10)
    assert version.status_code == 404 and "9.9" in version.json()["message"]
    route = requests.post(f"{base}/predictions/minilm/1.0/v1/nothing", json={}, headers=AUTH, timeout=10)
    assert route.status_code == 404
    assert cluster.dashboard_url.startswith("127.0.0.1:")  # Ray's dashboard and job API: loopback only


def test_metrics_carry_torchserves_names(cluster, minilm):
    """Through Ray's metrics API to each node's Prometheus endpoint; Ray's OpenTelemetry exporter
    prefixes `ray_` and lowercases (AotPackage is ray_aotpackage)."""
    embed(minilm, TEXTS)
    ports = {node["MetricsExportPort"] for node in ray.nodes() if node["Alive"]}

    def exported() -> list[str]:
        text = "".join(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text for port in ports)
        return [line for line in text.splitlines() if 'ModelName="minilm"' in line]

    wait_for(lambda: any(line.startswith("ray_bucketrequests") for line in exported()), 60, "the metrics exported")
    lines = exported()
    for name in ("aotpackage", "compilefallback", "recompilesafterready", "paddedtokenratio", "callkilotokens"):
        assert any(line.startswith(f"ray_{name}") for line in lines), name

    def values(name: str) -> list[float]:
        return [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(f"ray_{name}{{")]

    assert values("aotpackage") and set(values("aotpackage")) == {1.0}  # served from the archive's AOT package
    assert values("recompilesafterready") and set(values("recompilesafterready")) == {0.0}
    assert set(values("compilefallback")) == {0.0}


# -- faults -------------------------------------------------------------------------------------------
def test_a_replica_killed_under_load_leaves_no_request_unanswered_from_5_s_after(cluster, minilm):
    base = minilm
    victim = replicas("minilm")[0]
    load = Load(lambda: embed(base, TEXTS[:2], timeout=30), clients=4)
    time.sleep(3)
    killed = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    time.sleep(20)
    results = load.stop()
    after = Counter(status for sent, status in results if sent >= killed + 5)
    assert after and set(after) == {200}, after
    during = Counter(status for sent, status in results if killed <= sent < killed + 5)
    print(f"requests sent in the 5 s after the kill: {dict(during)}; after that: {dict(after)}")
    wait_for(lambda: running("minilm") == 2, 180, "the killed replica replaced")
    assert victim["pid"] not in [replica["pid"] for replica in replicas("minilm")]


def test_a_removed_node_s_replica_moves_to_a_spare_node(cluster, minilm):
    spare = cluster.add_node(num_cpus=1)
    worker_node = next(node for node in cluster.worker_nodes if node is not spare)
    moved = next(replica for replica in replicas("minilm") if replica["node"] == worker_node.node_id)
    cluster.remove_node(worker_node)
    wait_for(lambda: running("minilm") == 2 and len(replicas("minilm")) == 2, 240, "a replica on the spare node")
    assert spare.node_id in {replica["node"] for replica in replicas("minilm")}
    assert moved["pid"] not in [replica["pid"] for replica in replicas("minilm")]
    assert all(embed(minilm, TEXTS[:1]).status_code == 200 for _ in range(4))


# -- every task, and hostile bodies ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def colbert_archive(tmp_path_factory, tiny_models):
    """Eager: what Ray adds is its plumbing; the compiled model is tested in process and on TorchServe."""
    grid = {"dtype": "float32", "compile": {"enable": False}, "buckets": {"seq_lens": [16, 48], "batch_sizes": [1, 4]}}
    model = checked_model(tiny_models["colbert"])
    return build(model, "multi-vector", "colbert", tmp_path_factory.mktemp("ray_colbert"), {"handler": grid})


@pytest.fixture(scope="module")
def m3_archive(tmp_path_factory, tiny_models):
    """Eager, as the ColBERT one."""
    grid = {"dtype": "float32", "compile": {"enable": False}, "buckets": {"seq_lens": [16, 128], "batch_sizes": [1, 4]}}
    model = flag_reference.checked_model(tiny_models["m3"])
    return build(model, "m3-embedding", "m3", tmp_path_factory.mktemp("ray_m3"), {"handler": grid})


@pytest.fixture(scope="module")
def tiny_archives(tmp_path_factory, tiny_models, cluster, minilm, colbert_archive, m3_archive, span_receiver):
    """The other tasks' tiny archives (and a ColBERT and a bge-m3 one), one replica each, while
    MiniLM's two stay up; the embedder's replica sends its request spans to the run's OTLP endpoint."""
    store = tmp_path_factory.mktemp("ray_tiny_store")
    names = {
        "embedder": "embedding",
        "classifier": "text-classification",
        "tagger": "token-classification",
        "generator": "text-generation",
    }

    def built(name: str, task: str):
        extra = {"generation": {"max_new_tokens": 64}} if task == "text-generation" else {}
        if name == "embedder":
            extra = {"tracing": {"endpoint": span_receiver.url}}
        return build(tiny_models[task], task, name, store, {"handler": {**SMALL_GRID, **extra}})

    with ThreadPoolExecutor(2) as pool:  # an archiver's process waits on its files half the time
        archives = dict(zip(names, pool.map(built, names, names.values()), strict=True))
    archives.update(colbert=colbert_archive, m3=m3_archive)
    # All six at once, their replicas' start-ups (imports, loads, compiles) overlapping; half a CPU
    # per node is left beside MiniLM's replicas: 4 fit on each.
    serve.run_many([target(archive, name, ray_actor_options={"num_cpus": 0.125}) for name, archive in archives.items()])
    return {**names, "colbert": "multi-vector", "m3": "m3-embedding"}


def test_every_task_s_replica_answers_as_transformers(cluster, tiny_archives, tiny_models):
    texts = ["alice walks to paris quickly", "the cat sat on the red mat in berlin"]
    response = requests.post(f"{cluster.url}/predictions/classifier", json={"inputs": texts}, headers=AUTH, timeout=60)
    reference = pipeline("text-classification", model=str(tiny_models["text-classification"]))
    assert_same_answers(response.json(), [[answer] for answer in reference(texts)])
    body = {"inputs": texts, "aggregation_strategy": "simple"}
    tagged = requests.post(f"{cluster.url}/predictions/tagger", json=body, headers=AUTH, timeout=60)
    tagger = pipeline("token-classification", model=str(tiny_models["token-classification"]))
    assert_same_answers(tagged.json(), tagger(texts, aggregation_strategy="simple"))
    generator = f"{cluster.url}/predictions/generator"
    bodies = [{"inputs": "the cat", "max_new_tokens": 12}, {"inputs": "hello there", "max_new_tokens": 5}]
    with ThreadPoolExecutor(2) as pool:  # in the decode loop together
        answers = list(pool.map(lambda body: requests.post(generator, json=body, headers=AUTH, timeout=60), bodies))
    for body, answer in zip(bodies, answers, strict=True):
        wanted = generate_alone(tiny_models["text-generation"], body["inputs"], body["max_new_tokens"])
        assert answer.status_code == 200 and answer.json()["generated_text"] == wanted
    streamed = requests.post(generator, json={**bodies[0], "stream": True}, headers=AUTH, stream=True, timeout=60)
    chunks = [chunk for chunk in streamed.iter_content(chunk_size=None) if chunk]
    assert streamed.status_code == 200 and len(chunks) > 1
    refused = requests.post(generator, json={"inputs": "a", "top_k": -1}, headers=AUTH, timeout=60)
    assert refused.status_code == 400 and "top_k" in refused.json()["error"]
    colbert = f"{cluster.url}/predictions/colbert"
    body = {"inputs": REFERENCE["queries"], "input_type": "query"}
    queries = requests.post(colbert, json=body, headers=AUTH, timeout=60).json()
    assert_equal_vectors([answer["embedding"] for answer in queries], REFERENCE["query_vectors"])
    body = {"query": REFERENCE["queries"][1], "documents": REFERENCE["documents"]}
    ranked = requests.post(f"{colbert}/1.0/rerank", json=body, headers=AUTH, timeout=60).json()
    assert [one["score"] for one in ranked] == pytest.approx(
        [REFERENCE["maxsim"][1][one["index"]] for one in ranked], abs=1e-4
    )
    m3, m3_reference = f"{cluster.url}/predictions/m3", flag_reference.REFERENCE
    body = {"inputs": m3_reference["texts"], "return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    flag_reference.assert_equal_outputs(requests.post(m3, json=body, headers=AUTH, timeout=60).json())
    body = {"query": m3_reference["query"], "documents": m3_reference["texts"], "weights": m3_reference["weights"]}
    ranked = requests.post(f"{m3}/1.0/rerank", json=body, headers=AUTH, timeout=60).json()
    scores = [score["colbert+sparse+dense"] for score in m3_reference["scores"]]
    assert [one["score"] for one in ranked] == pytest.approx([scores[one["index"]] for one in ranked], abs=1e-4)


def test_a_replica_continues_each_callers_trace_with_a_span_per_step(cluster, tiny_archives, span_receiver):
    """The token scheduler's steps, from a replica on another process, to the run's OTLP endpoint."""
    trace_ids = ["a1" * 16, "b2" * 16, "c3" * 16]
    url = f"{cluster.url}/predictions/embedder"

    def send(trace_id: str) -> requests.Response:
        caller = {**AUTH, "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
        return requests.post(url, json={"inputs": ["hello world", "the cat sat"]}, headers=caller, timeout=60)

    with ThreadPoolExecutor(len(trace_ids)) as pool:
        assert [response.status_code for response in pool.map(send, trace_ids)] == [200] * len(trace_ids)
    steps = {"hfserve.request", "hfserve.tokenize", "hfserve.queue", "hfserve.model_call", "hfserve.encode"}
    for trace_id in trace_ids:
        spans = {span.name: span for span in span_receiver.trace(trace_id, steps)}
        request = spans["hfserve.request"]
        assert request.parent_id == "00f067aa0ba902b7" and request.attributes["hfserve.model"] == "embedder"
        assert request.attributes["hfserve.texts"] == 2 and request.attributes["http.response.status_code"] == 200
        assert spans["hfserve.queue"].end == spans["hfserve.model_call"].start
        assert all(span.parent_id == request.span_id for name, span in spans.items() if name != "hfserve.request")


def test_hostile_bodies_get_the_same_answers_as_on_torchserve(cluster, tiny_archives, task_server):
    """The fuzz test's cases for the embedder, each sent to TorchServe and to the replica."""
    base = cluster.url
    differences = []
    for case in hostile_cases("embedding", 7, 150, "embedder"):
        if case.content_type == "application/x-www-form-urlencoded":
            continue  # TorchServe's frontend decodes these itself, before any handler (test_fuzz_server.py)
        path = f"predictions/embedder/1.0/{case.route}" if case.route else "predictions/embedder"  # v2: by its body
        headers = {"Content-Type": case.content_type}
        theirs = requests.post(
            f"{task_server.inference_url}/{path}",
            data=case.body,
            headers={**headers, **task_server.headers("inference")},
            timeout=60,
        )
        ours = requests.post(f"{base}/{path}", data=case.body, headers={**headers, **AUTH}, timeout=60)
        assert ours.status_code < 500, f"{ours.status_code} for {case}"
        try:
            assert ours.status_code == theirs.status_code
            mine, reference = (without_request_id(body_of(response)) for response in (ours, theirs))
            assert_same_answers(mine, reference)  # refusals word for word, vectors within 1e-4
        except AssertionError as error:
            differences.append(
                f"{case}: TorchServe {theirs.status_code} {theirs.text[:200]}, Ray {ours.status_code}: {error}"
            )
    assert not differences, "\n".join(differences[:10])


def without_request_id(body):
    """A Cohere answer's `id` is new for every request: the rest must be the same."""
    return {key: value for key, value in body.items() if key != "id"} if isinstance(body, dict) else body


def test_a_replica_survives_oversized_bodies_sized_or_streamed(cluster, tiny_archives):
    """A body over `max_request_size` (TorchServe's 6,553,500 bytes) gets 413 whether its
    Content-Length says so (refused before the body is read) or it comes in chunks without one (cut
    off once past it); the replica keeps its pid and answers the next request."""
    before = replicas("embedder")
    url = f"{cluster.url}/predictions/embedder"
    sized = post_in_parts(url, {"Content-Length": "20000000"}, [b"a" * 65536])
    chunks = [b"a" * 1_000_000] * 6 + [b"a" * 600_000]  # 6.6 MB, and no last chunk: no end in sight
    streamed = post_in_parts(url, {"Transfer-Encoding": "chunked"}, [b"%x\r\n%s\r\n" % (len(c), c) for c in chunks])
    for status, body in (sized, streamed):
        assert status == 413 and "max_request_size" in body, (status, body[:200])
    ordinary = requests.post(url, json={"inputs": "still here"}, headers=AUTH, timeout=60)
    assert ordinary.status_code == 200 and replicas("embedder") == before


def post_in_parts(url: str, headers: dict, parts: list[bytes]) -> tuple[int, str]:
    """A POST whose body is `parts` as they are: no more than the server reads before it answers,
    so that no reset cuts its answer off while we still send. (status, body)."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    connection.putrequest("POST", parsed.path)
    for name, value in {**AUTH, "Content-Type": "application/json", **headers}.items():
        connection.putheader(name, value)
    connection.endheaders()
    for part in parts:
        connection.send(part)
    response = connection.getresponse()
    try:
        return response.status, response.read().decode()
    finally:
        connection.close()


def body_of(response: requests.Response):
    try:
        return response.json()
    except ValueError:
        return response.text


# -- autoscaling ------------------------------------------------------------------------------------------
def test_autoscaling_adds_a_replica_under_load_and_removes_it_when_idle(cluster, minilm_archive, tiny_archives):
    for name in ("minilm", *tiny_archives):
        serve.delete(name)
    scaling = {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 2,
        "upscale_delay_s": 1,
        "downscale_delay_s": 5,  # Serve's default is 600 s
    }
    deploy(minilm_archive, "scaled", "/", name="minilm", autoscaling_config=scaling)
    assert running("scaled") == 1
    base = cluster.url
    load = Load(lambda: embed(base, TEXTS, timeout=60), clients=8)
    try:
        wait_for(lambda: running("scaled") == 2, 180, "a second replica under load")
    finally:
        results = load.stop()
    assert set(Counter(status for _, status in results)) == {200}
    wait_for(lambda: running("scaled") == 1, 120, "back to one replica when idle")
    serve.delete("scaled")


# -- Ray Data ---------------------------------------------------------------------------------------------
def test_ray_data_embeds_2000_texts_as_sentence_transformers(cluster, minilm_archive, reference):
    from ts_compiled_handlers.servers.ray.data import Embedder

    wait_for(lambda: not serve.status().applications, 60, "the Serve applications gone")
    texts = [f"{TEXTS[index % 3]} number {index}" for index in range(2000)]
    dataset = ray.data.from_items([{"text": text, "row": index} for index, text in enumerate(texts)])
    embedded = dataset.map_batches(
        Embedder,
        fn_constructor_kwargs={"archive": str(minilm_archive)},
        compute=ray.data.ActorPoolStrategy(size=2),
        num_cpus=1,
        batch_size=200,
    )
    rows = sorted(embedded.take_all(), key=lambda row: row["row"])
    assert [row["text"] for row in rows] == texts
    got = [row["embedding"].tolist() for row in rows]
    assert min(cosines(got, reference.encode(texts, batch_size=64))) >= 0.9999


def test_ray_data_gives_colbert_and_bge_m3_vectors_as_pylate_and_flag_embedding(cluster, colbert_archive, m3_archive):
    from ts_compiled_handlers.servers.ray.data import M3Embedder, MultiVectorEmbedder

    wait_for(lambda: not serve.status().applications, 60, "the Serve applications gone")
    for input_type, texts, wanted in (
        ("document", REFERENCE["documents"], REFERENCE["document_vectors"]),
        ("query", REFERENCE["queries"], REFERENCE["query_vectors"]),
    ):
        dataset = ray.data.from_items([{"text": text, "row": index} for index, text in enumerate(texts)])
        kwargs = {"archive": str(colbert_archive), "input_type": input_type}
        embedded = dataset.map_batches(
            MultiVectorEmbedder, fn_constructor_kwargs=kwargs, compute=ray.data.ActorPoolStrategy(size=1), batch_size=2
        )
        rows = sorted(embedded.take_all(), key=lambda row: row["row"])
        assert_equal_vectors([row["embedding"] for row in rows], wanted)
    texts = flag_reference.REFERENCE["texts"]
    dataset = ray.data.from_items([{"text": text, "row": index} for index, text in enumerate(texts)])
    kwargs = {"archive": str(m3_archive), "return_sparse": True, "return_colbert_vecs": True}
    embedded = dataset.map_batches(
        M3Embedder, fn_constructor_kwargs=kwargs, compute=ray.data.ActorPoolStrategy(size=1), batch_size=2
    )
    rows = sorted(embedded.take_all(), key=lambda row: row["row"])
    answers = [
        {
            "dense_vecs": row["dense_vecs"],
            "lexical_weights": dict(zip(map(str, row["sparse_indices"]), row["sparse_values"].tolist(), strict=True)),
            "colbert_vecs": row["colbert_vecs"],
        }
        for row in rows
    ]
    flag_reference.assert_equal_outputs(answers)


def test_embed_corpus_writes_parquet_and_int8_jsonl(cluster, minilm_archive, reference, tmp_path):
    """Float32 vectors to Parquet; int8 ones (`--precision int8`) to JSON Lines, equal to
    sentence-transformers' `quantize_embeddings` of the float32 ones with the archive's ranges."""
    corpus = tmp_path / "corpus.jsonl"
    texts = [f"document {index}: {TEXTS[index % 3]}" for index in range(50)]
    corpus.write_text("".join(json.dumps({"text": text, "id": index}) + "\n" for index, text in enumerate(texts)))
    for output, precision in ((tmp_path / "vectors.parquet", "float32"), (tmp_path / "vectors.jsonl", "int8")):
        command = [sys.executable, "-m", "ts_compiled_handlers.scripts.cli", "embed-corpus", str(corpus), str(output)]
        command += ["--archive", str(minilm_archive), "--address", cluster.address]  # one actor: a CPU left to read
        done = subprocess.run([*command, "--precision", precision], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"50 rows embedded into {output}" in done.stdout
    table = sorted(ray.data.read_parquet(str(tmp_path / "vectors.parquet")).take_all(), key=lambda row: row["id"])
    assert [row["id"] for row in table] == list(range(50))
    floats = np.stack([row["embedding"] for row in table]).astype(np.float32)
    assert min(cosines(floats.tolist(), reference.encode(texts))) >= 0.9999
    rows = [json.loads(line) for line in (tmp_path / "vectors.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == list(range(50))
    saved = json.loads(zipfile.ZipFile(minilm_archive).read("answer_ranges.json"))
    wanted = quantize_embeddings(floats, "int8", ranges=np.array([saved["min"], saved["max"]], dtype=np.float32))
    made = np.array([row["embedding"] for row in rows])
    # two runs of the compiled model: a value on a bucket's edge may land one bucket over
    assert np.abs(made.astype(int) - wanted).max() <= 1 and (made == wanted).mean() >= 0.999


def test_embed_corpus_chunks_documents_of_10_to_5000_tokens_and_pools_them_per_document(
    cluster, minilm_archive, reference, tmp_path
):
    """Every chunk once and in order, spans covering each document's tokens, each chunk's vector the
    embedding of its own text; `--per-document mean` the chunks' normalized mean."""
    words = " ".join(f"{TEXTS[index % 3]} item{index}" for index in range(1200)).split()
    documents = [" ".join(words[:count]) for count in (10, 120, 700, 3200)]
    lengths = [len(reference.tokenizer(text, add_special_tokens=False)["input_ids"]) for text in documents]
    assert min(lengths) >= 10 and max(lengths) >= 5000
    corpus = tmp_path / "documents.jsonl"
    corpus.write_text("".join(json.dumps({"text": text, "id": index}) + "\n" for index, text in enumerate(documents)))
    command = [sys.executable, "-m", "ts_compiled_handlers.scripts.cli", "embed-corpus", str(corpus)]
    command += ["--archive", str(minilm_archive), "--address", cluster.address, "--chunk-tokens", "128"]
    for output, extra in (
        ("chunks.jsonl", ["--chunk-overlap", "16"]),
        ("pooled.jsonl", ["--chunk-overlap", "16", "--per-document", "mean"]),
    ):
        done = subprocess.run([*command, str(tmp_path / output), *extra], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    chunks = [json.loads(line) for line in (tmp_path / "chunks.jsonl").read_text().splitlines()]
    assert [(row["id"], row["chunk"]) for row in chunks] == sorted((row["id"], row["chunk"]) for row in chunks)
    for index, text in enumerate(documents):
        own = [row for row in chunks if row["id"] == index]
        assert [row["chunk"] for row in own] == list(range(len(own))) and len(own) >= lengths[index] / 128
        assert all(row["text"] == text[row["chunk_start"] : row["chunk_end"]] for row in own)
        tokens = reference.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        assert all(any(row["chunk_start"] <= a and b <= row["chunk_end"] for row in own) for a, b in tokens)
    vectors = np.array([row["embedding"] for row in chunks], dtype=np.float32)
    assert min(cosines(vectors.tolist(), reference.encode([row["text"] for row in chunks]))) >= 0.9999
    pooled = [json.loads(line) for line in (tmp_path / "pooled.jsonl").read_text().splitlines()]
    assert [row["id"] for row in pooled] == list(range(len(documents)))
    means = [vectors[[row["id"] == index for row in chunks]].mean(axis=0) for index in range(len(documents))]
    assert min(cosines([row["embedding"] for row in pooled], np.stack(means))) >= 0.9999


@pytest.fixture(scope="module")
def clip_archive(tmp_path_factory, tiny_models):
    """Eager, as the ColBERT one."""
    grid = {"dtype": "float32", "compile": {"enable": False}, "buckets": {"seq_lens": [16, 64], "batch_sizes": [1, 4]}}
    model = tiny_models["image-text-embedding"]
    return build(model, "image-text-embedding", "clip", tmp_path_factory.mktemp("ray_clip"), {"handler": grid})


def test_ray_data_embeds_an_image_column_of_bytes_or_paths_as_transformers(
    cluster, clip_archive, tiny_models, tmp_path
):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image
    from transformers import AutoImageProcessor, CLIPModel

    from ts_compiled_handlers.servers.ray.data import ImageEmbedder

    pictures = []
    for seed in range(5):
        pixels = (np.random.default_rng(seed).random((30 + seed, 40, 3)) * 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(out, "PNG")
        pictures.append(out.getvalue())
    model_dir = tiny_models["image-text-embedding"]
    processor, model = AutoImageProcessor.from_pretrained(model_dir), CLIPModel.from_pretrained(model_dir).eval()
    with torch.inference_mode():
        inputs = processor(
            images=[Image.open(io.BytesIO(data)).convert("RGB") for data in pictures], return_tensors="pt"
        )
        wanted = model.get_image_features(**inputs).pooler_output
    paths = []
    for index, data in enumerate(pictures):
        paths.append(str(tmp_path / f"{index}.png"))
        (tmp_path / f"{index}.png").write_bytes(data)
    pq.write_table(
        pa.table({"row": list(range(5)), "image": pictures, "path": paths}), str(tmp_path / "images.parquet")
    )
    dataset = ray.data.read_parquet(str(tmp_path / "images.parquet"))
    for column in ("image", "path"):
        kwargs = {"archive": str(clip_archive), "image_column": column, "image_root": str(tmp_path)}
        embedded = dataset.map_batches(
            ImageEmbedder, fn_constructor_kwargs=kwargs, compute=ray.data.ActorPoolStrategy(size=1), batch_size=2
        )
        rows = sorted(embedded.take_all(), key=lambda row: row["row"])
        got = torch.tensor(np.stack([row["embedding"] for row in rows]))
        assert torch.nn.functional.cosine_similarity(got, wanted, dim=-1).min().item() >= 0.9999, column


def test_ray_serve_answers_images_and_texts_and_refuses_a_bad_image_alone(cluster, clip_archive, tiny_models):
    import base64
    import io

    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    pixels = (np.random.default_rng(3).random((30, 40, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "PNG")
    picture = out.getvalue()
    model_dir = tiny_models["image-text-embedding"]
    model = CLIPModel.from_pretrained(model_dir).eval()
    processor, tokenizer = AutoImageProcessor.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    with torch.inference_mode():
        image = model.get_image_features(**processor(images=[Image.open(io.BytesIO(picture))], return_tensors="pt"))
        text = model.get_text_features(**tokenizer(["a cat"], return_tensors="pt"))
    serve.run_many([target(clip_archive, "clip", ray_actor_options={"num_cpus": 0.125})])
    try:
        url = f"{cluster.url}/predictions/clip"
        uri = "data:image/png;base64," + base64.b64encode(picture).decode()
        mixed = requests.post(url, json={"inputs": [{"image": uri}, "a cat"]}, headers=AUTH, timeout=60)
        binary = requests.post(url, data=picture, headers={**AUTH, "Content-Type": "image/png"}, timeout=60)
        truncated = requests.post(url, data=picture[:100], headers={**AUTH, "Content-Type": "image/png"}, timeout=60)
        got = torch.tensor([mixed.json()[0]["embedding"], mixed.json()[1]["embedding"], binary.json()["embedding"]])
        wanted = torch.cat([image.pooler_output, text.pooler_output, image.pooler_output])
        assert torch.nn.functional.cosine_similarity(got, wanted, dim=-1).min().item() >= 0.9999
        assert truncated.status_code == 400 and "truncated or corrupt PNG" in truncated.json()["error"]
        hostile_images_fail_alone(url, uri, got[0], model, processor)
    finally:
        serve.delete("clip")


def hostile_images_fail_alone(url: str, uri: str, wanted: torch.Tensor, model, processor) -> None:
    """Through the replica's token scheduler: 64 palette PNGs of 40 megapixels (5 KB each) refused
    from their headers, an animated GIF from its own, a phone photo stored sideways embedded as
    transformers' `load_image` turns it; the ordinary request sent beside them answered."""
    import base64
    import io

    from PIL import Image
    from transformers.image_utils import load_image

    def data_uri(image, image_format="PNG", **save) -> str:
        out = io.BytesIO()
        image.save(out, image_format, **save)
        return f"data:image/{image_format.lower()};base64," + base64.b64encode(out.getvalue()).decode()

    frames = [Image.new("RGB", (16, 16), (index * 40, 0, 0)) for index in range(5)]
    photo = Image.fromarray((np.random.default_rng(5).random((48, 64, 3)) * 255).astype(np.uint8), "RGB")
    exif = photo.getexif()
    exif[0x0112] = 6
    sideways = data_uri(photo, "JPEG", exif=exif.tobytes(), quality=95)
    bodies = [
        {"inputs": [{"image": data_uri(Image.new("P", (6324, 6324)), bits=1, optimize=True)}] * 64},
        {"inputs": [{"image": data_uri(frames[0], "GIF", save_all=True, append_images=frames[1:])}]},
        {"inputs": [{"image": sideways}]},
        {"inputs": [{"image": uri}]},
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: requests.post(url, json=body, headers=AUTH, timeout=60), bodies))
    assert answers[0].status_code == 413 and "images.request_pixels" in answers[0].json()["error"]
    assert answers[1].status_code == 400 and "animated GIF" in answers[1].json()["error"]
    with torch.inference_mode():
        upright = model.get_image_features(**processor(images=[load_image(sideways)], return_tensors="pt"))
    got = torch.tensor([answers[2].json()[0]["embedding"], answers[3].json()[0]["embedding"]])
    cosines = torch.nn.functional.cosine_similarity(got, torch.stack([upright.pooler_output[0], wanted]), dim=-1)
    assert cosines.min().item() >= 0.9999
