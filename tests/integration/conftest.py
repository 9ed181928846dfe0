"""One TorchServe with a tiny archive of every task, shared by the task and fuzz tests of the run."""

import pytest
from archives import SMALL_GRID, TASK_ARCHIVES

from scripts.build_mar import build
from scripts.serve import TorchServe


@pytest.fixture(scope="session")
def task_server(tmp_path_factory, tiny_models):
    """Batches of up to 4 requests, gathered for 100 ms, so concurrent requests share batches."""
    store = tmp_path_factory.mktemp("task_model_store")
    for name, task in TASK_ARCHIVES.items():
        extra = {"generation": {"max_new_tokens": 16}} if task == "text-generation" else {}
        build(tiny_models[task], task, name, store, {"handler": {**SMALL_GRID, **extra}})
    torchserve = TorchServe.on_free_ports(tmp_path_factory.mktemp("task_torchserve"), store)
    torchserve.start()
    try:
        for name in TASK_ARCHIVES:
            torchserve.register(f"{name}.mar", batch_size=4, max_batch_delay=100, workers=1)
        yield torchserve
    finally:
        torchserve.stop()
