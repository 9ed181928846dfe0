"""A worker and its loops need no server, and a Ray replica needs no TorchServe: requests are served
where `ts` cannot even be imported."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from fakes import NO_TORCHSERVE

SCRIPT = NO_TORCHSERVE + textwrap.dedent(
    """
    import asyncio, json, sys

    import torch
    from sentence_transformers import SentenceTransformer

    from ts_compiled_handlers.loops.model_thread import ModelThread
    from ts_compiled_handlers.loops.request_batches import RequestBatches
    from ts_compiled_handlers.loops.scheduled_requests import ScheduledRequests
    from ts_compiled_handlers.configuration.placement import Placement
    from ts_compiled_handlers.tasks.embedding import EmbeddingTask
    from ts_compiled_handlers.worker.messages import Incoming
    from ts_compiled_handlers.worker.worker import NULL_SINK, Worker
    from ts_compiled_handlers.servers.archive import Archive
    from ts_compiled_handlers.servers.ray import serve as ray_serve

    model_dir, archive_path = sys.argv[1], sys.argv[2]
    grid = {"seq_lens": [8, 32], "batch_sizes": [1, 4]}
    handler = {"dtype": "float32", "buckets": grid, "compile": {"enable": False}}
    config = {"asyncCommunication": True, "handler": handler}
    thread, worker = ModelThread.start(Worker.build, Placement(model_dir, "tiny", config), EmbeddingTask)
    body = json.dumps({"inputs": ["hello world", "a longer text about rivers"]}).encode()
    batch = [Incoming(body, "application/json"), Incoming(b"", "application/json")]
    batches = RequestBatches(worker).serve_batch(batch)
    scheduled = asyncio.run(ScheduledRequests(worker, thread).reply(Incoming(body, "application/json")))
    archive = Archive.open(archive_path)
    replica_worker, replica_loop = ray_serve.start_replica(archive, "tiny", 1, None, NULL_SINK)
    async def yielded(replies):  # what the loop yields for one request, as a server takes it
        return [reply async for reply in replies]

    (replica,) = asyncio.run(yielded(replica_loop.serve(Incoming(body, "application/json"))))
    expected = SentenceTransformer(model_dir, device="cpu").encode(["hello world", "a longer text about rivers"])
    print(json.dumps({
        "statuses": [reply.status for reply in batches] + [scheduled.status, replica.status],
        "replica": [row["embedding"] for row in json.loads(replica.body)],
        "replica_loop": type(replica_loop).__name__,
        "batches": [row["embedding"] for row in json.loads(batches[0].body)],
        "scheduled": [row["embedding"] for row in json.loads(scheduled.body)],
        "refusal": json.loads(batches[1].body),
        "expected": expected.tolist(),
        "ts_loaded": any(name == "ts" or name.startswith("ts.") for name in sys.modules),
    }))
    """
)


def test_a_request_is_served_through_a_worker_both_loops_and_a_ray_replica_where_ts_cannot_be_imported(
    tiny_models, tmp_path
):
    from ts_compiled_handlers.scripts import build_mar

    pytest.importorskip("ray", reason="the ray extra")
    grid = {"seq_lens": [8, 32], "batch_sizes": [1, 4]}
    handler = {"dtype": "float32", "buckets": grid, "compile": {"enable": False}}
    archive = build_mar.build(tiny_models["embedding"], "embedding", "tiny", tmp_path, {"handler": handler})
    command = [sys.executable, "-c", SCRIPT, str(tiny_models["embedding"]), str(archive)]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the archive unpacked in this test's own folder
    ran = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["statuses"] == [200, 400, 200, 200] and not found["ts_loaded"]
    assert found["replica_loop"] == "ScheduledRequests"  # requests one at a time, whatever the archive's batchSize
    assert "empty request body" in found["refusal"]["error"]
    import torch

    expected = torch.tensor(found["expected"])
    for served in (found["batches"], found["scheduled"], found["replica"]):
        cosine = torch.nn.functional.cosine_similarity(torch.tensor(served), expected)
        assert cosine.min() > 0.9999, cosine
