"""One TorchServe with a tiny archive of every task, shared by the task and fuzz tests of the run."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from archives import SMALL_GRID, TASK_ARCHIVES

from scripts.build_mar import build
from scripts.serve import TorchServe

STARTUP_SECONDS = 600


@pytest.fixture(scope="session")
def task_server(tmp_path_factory, tiny_models):
    """Batches of up to 4 requests, gathered for 100 ms, so concurrent requests share batches."""
    store = tmp_path_factory.mktemp("task_model_store")
    for name, task in TASK_ARCHIVES.items():
        extra = {"generation": {"max_new_tokens": 256}} if task == "text-generation" else {}
        # Four workers compile at once on as few as two cores: more time than one alone is given.
        config = {"startupTimeout": STARTUP_SECONDS, "handler": {**SMALL_GRID, **extra}}
        build(tiny_models[task], task, name, store, config)
    torchserve = TorchServe.on_free_ports(tmp_path_factory.mktemp("task_torchserve"), store)
    torchserve.start()
    try:
        # All at once: their workers' start-ups (interpreter, imports, model load) overlap.
        with ThreadPoolExecutor(len(TASK_ARCHIVES)) as pool:
            list(pool.map(lambda name: torchserve.register(f"{name}.mar", 4, 100, 1), TASK_ARCHIVES))
        yield torchserve
    finally:
        torchserve.stop()
