"""A worker and its loops need no server: a request is served where `ts` cannot even be imported."""

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, importlib.abc, json, sys

    class NoTorchServe(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ts" or name.startswith("ts."):
                raise ImportError(f"{name}: TorchServe is not importable in this process")

    sys.meta_path.insert(0, NoTorchServe())

    import torch
    from sentence_transformers import SentenceTransformer

    from ts_compiled_handlers.loops.model_thread import ModelThread
    from ts_compiled_handlers.loops.request_batches import RequestBatches
    from ts_compiled_handlers.loops.scheduled_requests import ScheduledRequests
    from ts_compiled_handlers.startup.serving import Placement
    from ts_compiled_handlers.tasks.embedding import EmbeddingTask
    from ts_compiled_handlers.worker.worker import Incoming, Worker

    model_dir = sys.argv[1]
    grid = {"seq_lens": [8, 32], "batch_sizes": [1, 4]}
    handler = {"dtype": "float32", "buckets": grid, "compile": {"enable": False}}
    config = {"asyncCommunication": True, "handler": handler}
    thread, worker = ModelThread.start(Worker.build, Placement(model_dir, "tiny", config), EmbeddingTask)
    body = json.dumps({"inputs": ["hello world", "a longer text about rivers"]}).encode()
    batches = RequestBatches(worker).serve([Incoming(body, "application/json"), Incoming(b"", "application/json")])
    scheduled = asyncio.run(ScheduledRequests(worker, thread).serve(Incoming(body, "application/json")))
    expected = SentenceTransformer(model_dir, device="cpu").encode(["hello world", "a longer text about rivers"])
    print(json.dumps({
        "statuses": [reply.status for reply in batches] + [scheduled.status],
        "batches": [row["embedding"] for row in json.loads(batches[0].body)],
        "scheduled": [row["embedding"] for row in json.loads(scheduled.body)],
        "refusal": json.loads(batches[1].body),
        "expected": expected.tolist(),
        "ts_loaded": any(name == "ts" or name.startswith("ts.") for name in sys.modules),
    }))
    """
)


def test_a_request_is_served_through_a_worker_and_both_loops_where_ts_cannot_be_imported(tiny_models):
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_models["embedding"])], capture_output=True, text=True, timeout=600
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout.strip().splitlines()[-1])
    assert found["statuses"] == [200, 400, 200] and not found["ts_loaded"]
    assert "empty request body" in found["refusal"]["error"]
    import torch

    expected = torch.tensor(found["expected"])
    for served in (found["batches"], found["scheduled"]):
        cosine = torch.nn.functional.cosine_similarity(torch.tensor(served), expected)
        assert cosine.min() > 0.9999, cosine
