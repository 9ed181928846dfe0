"""One TorchServe with a tiny archive of every task and of the models users bring, and the
documentation's archives, shared by the task, model, fuzz and documentation tests of the run; and
the wheel install, started as soon as it is needed."""

import os
from concurrent.futures import ThreadPoolExecutor

import image_build
import pytest
import torch
import wheel_install as wheel_install_module
from archives import (
    AOT_ARCHIVES,
    DOCUMENTED_ARCHIVES,
    IMAGE_ARCHIVES,
    LORA_ARCHIVES,
    MODEL_ARCHIVES,
    SMALL_GRID,
    TASK_ARCHIVES,
    TRACED_ARCHIVES,
)
from image_server import serving_pictures
from lora_reference import embedder_with_adapters, ranker_with_adapters
from otlp_receiver import receiving
from transformers import AutoModelForCausalLM, AutoTokenizer

from ts_compiled_handlers.scripts.build_mar import build
from ts_compiled_handlers.scripts.serve import TorchServe

STARTUP_SECONDS = 600
WHEEL_INSTALL: list = []  # the background wheel install of the run, if a selected test needs one


def pytest_collection_modifyitems(session, config, items):
    """Start the wheel install (tests/wheel_install.py) once the tests are chosen, if one of them
    uses it: its pip runs beside the tests before it."""
    if any("wheel_install" in getattr(item, "fixturenames", ()) for item in items):
        WHEEL_INSTALL.append(wheel_install_module.start())


def pytest_sessionfinish(session, exitstatus):
    for install in WHEEL_INSTALL:
        install.remove()


@pytest.fixture(scope="session")
def image():
    """The image scripts/build_image.sh builds; skipped where Docker cannot run, unless
    HFSERVE_REQUIRE_DOCKER=1 (CI) makes that a failure."""
    if not image_build.docker_usable():
        if os.environ.get("HFSERVE_REQUIRE_DOCKER") == "1":
            pytest.fail("HFSERVE_REQUIRE_DOCKER=1 but Docker cannot run here (no daemon, not root)")
        pytest.skip("no Docker daemon, and not root to start one (HFSERVE_REQUIRE_DOCKER=1 makes this a failure)")
    return image_build.build()


@pytest.fixture(scope="session")
def wheel_install():
    """The wheel install started at collection (ready() waits for it)."""
    return WHEEL_INSTALL[0]


@pytest.fixture(scope="session")
def picture_origin():
    """The run's picture server (tests/image_server.py), an origin the guarded CLIP fetches from."""
    with serving_pictures() as origin:
        yield origin


@pytest.fixture(scope="session")
def span_receiver():
    """The run's OTLP/HTTP trace endpoint, on loopback (tests/otlp_receiver.py)."""
    with receiving() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def lora_models(tiny_models, tmp_path_factory):
    """The tiny embedder and cross-encoder with two PEFT adapters each: (folder, adapter folders,
    the reference answers of PEFT's merged models) by name (tests/lora_reference.py)."""
    root = tmp_path_factory.mktemp("lora")
    return {
        "embedder": embedder_with_adapters(tiny_models["embedding"], root),
        "ranker": ranker_with_adapters(tiny_models["cross-encoder"], root),
    }


@pytest.fixture(scope="session")
def task_server(tmp_path_factory, tiny_models, minilm_dir, picture_origin, span_receiver, lora_models):
    """Batches of up to 4 requests, gathered for 100 ms, so concurrent requests share batches."""
    models = {**tiny_models, "minilm": minilm_dir}
    store = tmp_path_factory.mktemp("task_model_store")
    builds = []  # (model folder, task, name, model config, precompile[, adapters])
    for name, task in TASK_ARCHIVES.items():
        extra = {"generation": {"max_new_tokens": 256}} if task == "text-generation" else {}
        # Four workers compile at once on as few as two cores: more time than one alone is given.
        config = {"startupTimeout": STARTUP_SECONDS, "handler": {**SMALL_GRID, **extra}}
        builds.append((tiny_models[task], task, name, config, None))
    for name, (model, task, settings) in {**MODEL_ARCHIVES, **AOT_ARCHIVES}.items():
        config = {"startupTimeout": STARTUP_SECONDS, "handler": {**SMALL_GRID, **settings}}
        builds.append((models[model], task, name, config, "aot" if name in AOT_ARCHIVES else None))
    for name, (model, task, settings) in DOCUMENTED_ARCHIVES.items():
        builds.append((models[model], task, name, {"startupTimeout": STARTUP_SECONDS, "handler": settings}, None))
    for name, (model, task, settings) in IMAGE_ARCHIVES.items():
        images = {**settings["images"], "fetch_from": [picture_origin]}
        config = {"startupTimeout": STARTUP_SECONDS, "handler": {**settings, "images": images}}
        builds.append((models[model], task, name, config, None))
    for name, (model, task, settings) in TRACED_ARCHIVES.items():
        config = {
            "startupTimeout": STARTUP_SECONDS,
            "handler": {**settings, "tracing": {"endpoint": span_receiver.url}},
        }
        builds.append((models[model], task, name, config, None))
    for name, (model, task, settings) in LORA_ARCHIVES.items():
        folder, adapters, _ = lora_models[model]
        builds.append((folder, task, name, {"startupTimeout": STARTUP_SECONDS, "handler": settings}, None, adapters))

    # Two at a time: a build waits on its archiver's and its AOT export's processes for half its time.
    def built(item: tuple) -> None:
        build(*item[:3], store, item[3], precompile=item[4], adapters=item[5] if len(item) > 5 else None)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(built, builds))
    torchserve = TorchServe.on_free_ports(tmp_path_factory.mktemp("task_torchserve"), store)
    torchserve.start()
    names = [*TASK_ARCHIVES, *MODEL_ARCHIVES, *AOT_ARCHIVES, *DOCUMENTED_ARCHIVES, *IMAGE_ARCHIVES, *TRACED_ARCHIVES]
    names += list(LORA_ARCHIVES)
    try:
        # All at once: their workers' start-ups (interpreter, imports, model load) overlap.
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda name: torchserve.register(f"{name}.mar", 4, 100, 1), names))
        yield torchserve
    finally:
        torchserve.stop()


@pytest.fixture(scope="session")
def generate(tiny_models):
    """`generate(prompt, n)`: the text transformers' greedy `generate()` gives the tiny generator's prompt alone."""
    folder = tiny_models["text-generation"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def run(prompt: str, max_new_tokens: int) -> str:
        inputs = tokenizer(prompt, return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)

    return run
