"""The parts of the Ray servers that need no cluster: TorchServe's inference API outside TorchServe,
archives opened outside TorchServe, the replica's configuration and key, and the continuous-batching
driver (tests/integration/test_ray.py runs them all on a real cluster)."""

import asyncio
import dataclasses
import json
import os
import stat
import zipfile
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pydantic
import pytest
import yaml

from ts_compiled_handlers.configuration.placement import Loop, loop_of
from ts_compiled_handlers.loops.decode_loop_driver import ContinuousRequests
from ts_compiled_handlers.request.outcome import refusal
from ts_compiled_handlers.runtime import package_files
from ts_compiled_handlers.servers import inference_api
from ts_compiled_handlers.servers.archive import Archive, ArchiveError, with_threads
from ts_compiled_handlers.servers.inference_api import Route, route_of
from ts_compiled_handlers.tasks.embedding import EmbeddingTask
from ts_compiled_handlers.worker.messages import Incoming, Reply
from ts_compiled_handlers.worker.worker import Worker

HANDLER = package_files.PACKAGE / package_files.HANDLER

ray_serve = pytest.importorskip("ts_compiled_handlers.servers.ray.serve", reason="the ray extra")


@pytest.mark.parametrize(
    "path, route",
    [
        ("/predictions/minilm", Route("minilm", None, "")),
        ("/predictions/minilm/", Route("minilm", None, "")),
        ("/predictions/minilm/1.0", Route("minilm", "1.0", "")),
        ("/predictions/minilm/1.0/v1/embeddings", Route("minilm", "1.0", "v1/embeddings")),
        ("/v2/models/minilm/infer", Route("minilm", None, "")),
        ("/v2/models/minilm/versions/2.0/infer", Route("minilm", "2.0", "")),
        ("/predictions", None),
        ("/predictions//1.0", None),
        ("/v2/models/minilm", None),
        ("/v2/models/minilm/ready/infer", None),
        ("/models/minilm", None),
    ],
)
def test_paths_read_as_torchserve_routes_them(path, route):
    assert route_of(path) == route


def test_the_key_is_checked_by_its_digest_and_only_as_a_bearer_token():
    digest = inference_api.key_digest("s3cret")
    assert inference_api.authorized("Bearer s3cret", digest)
    assert inference_api.authorized("bearer  s3cret ", digest)
    for header in (None, "", "s3cret", "Basic s3cret", "Bearer s3cre", "Bearer s3cret2"):
        assert not inference_api.authorized(header, digest), header
    assert "s3cret" not in digest


def test_the_frontend_s_refusals_have_torchserves_shape():
    def refused(path, method="POST"):
        reply = inference_api.refusal(path, method, route_of(path), "minilm", "1.0")
        return None if reply is None else (reply.status, json.loads(reply.body)["type"])

    assert refused("/predictions/minilm") is None
    assert refused("/predictions/minilm/1.0/v1/models", "GET") is None
    assert refused("/predictions/other") == (404, "ModelNotFoundException")
    assert refused("/predictions/minilm/2.0") == (404, "ModelVersionNotFoundException")
    assert refused("/metrics") == (404, "ResourceNotFoundException")
    assert refused("/predictions/minilm", "DELETE") == (405, "MethodNotAllowedException")
    assert inference_api.unauthorized().headers["WWW-Authenticate"] == "Bearer"


def test_a_replica_serves_requests_one_at_a_time_with_its_cpus_as_threads(tmp_path):
    opened = Archive.open(fake_archive(tmp_path), root=tmp_path / "unpacked")

    def replica(yaml_config: dict, cpus: float):
        return ray_serve.for_replica(dataclasses.replace(opened, yaml_config=yaml_config), cpus)

    torchserve_keys = {"batchSize": 8, "maxBatchDelay": 5, "minWorkers": 2, "asyncCommunication": False}
    placement, config = replica({**torchserve_keys, "handler": {"task": "embedding"}}, 2)
    assert (placement.one_at_a_time, placement.continuous, placement.workers, config.threads) == (True, False, 1, 2)
    assert loop_of(config.task, placement) is Loop.SCHEDULED
    assert placement.yaml_config["batchSize"] == 8  # read as the archive has it, not rewritten for a loop
    placement, config = replica({"handler": {"task": "text-generation"}}, 0.5)
    assert loop_of(config.task, placement) is Loop.DECODE_LOOP
    assert config.threads == 1  # a fraction of a CPU is still one thread
    assert with_threads({"handler": {"task": "embedding", "threads": 4}}, 1)["handler"]["threads"] == 4  # fixed: kept
    assert with_threads({"handler": {"task": "embedding"}}, None) == {"handler": {"task": "embedding"}}  # outside Ray


def test_the_key_comes_from_the_environment_or_a_file_made_once(tmp_path, monkeypatch):
    monkeypatch.setenv(ray_serve.KEY_ENV, "from-env")
    assert ray_serve.api_key(None, "m") == "from-env"
    monkeypatch.delenv(ray_serve.KEY_ENV)
    path = tmp_path / "keys" / "m.key"
    made = ray_serve.api_key(str(path), "m")
    assert len(made) >= 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ray_serve.api_key(str(path), "m") == made  # the same key for every later build


def test_a_key_in_the_arguments_is_refused_where_serve_would_store_it():
    with pytest.raises(pydantic.ValidationError, match="api_key"):
        ray_serve.AppArgs.model_validate({"archive": "minilm.mar", "api_key": "secret"})


def fake_archive(folder, handler_source: str | None = None, member_names=()) -> "os.PathLike":
    """A .mar as our build lays one out, without a model: manifest, model-config.yaml, handler file."""
    path = folder / "model.mar"
    manifest = {
        "model": {
            "modelName": "fake",
            "modelVersion": "2.0",
            "handler": "embedding.py",
            "configFile": "model-config.yaml",
        }
    }
    handler = handler_source or HANDLER.read_text()
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("model-config.yaml", yaml.safe_dump({"handler": {"task": "embedding"}}))
        archive.writestr("embedding.py", handler)
        for name in member_names:
            archive.writestr(name, "x")
    return path


def test_an_archive_is_unpacked_once_per_machine_and_names_its_task(tmp_path):
    path = fake_archive(tmp_path)
    first = Archive.open(path, root=tmp_path / "unpacked")
    again = Archive.open(path, root=tmp_path / "unpacked")
    assert first == again and len(list((tmp_path / "unpacked").iterdir())) == 1
    assert (first.model_name, first.model_version, first.yaml_config) == (
        "fake",
        "2.0",
        {"handler": {"task": "embedding"}},
    )
    assert first.served_by() == (EmbeddingTask, Worker)  # our handler file: our worker, the config's task
    assert first.handler_class().__name__ == "Handler"
    placement = first.placement({"handler": {}}, "renamed")
    assert (placement.model_name, placement.model_version, placement.batch_size) == ("renamed", "2.0", None)


def test_a_handler_of_ones_own_names_the_task_class_every_server_and_the_build_serve(tmp_path):
    """`task_class` (a subclass of the archive's task, to add a protocol) wins wherever a handler's
    task is asked: TorchServe's initialize, the build's precompile step and Ray's archive."""
    from ts_compiled_handlers.configuration.config import parse
    from ts_compiled_handlers.servers.torchserve.handler import Handler

    own = (
        "from ts_compiled_handlers.servers.torchserve.handler import Handler\n"
        "from ts_compiled_handlers.tasks.embedding import EmbeddingTask\n\n\n"
        "class Shouting(EmbeddingTask):\n    pass\n\n\n"
        "class Mine(Handler):\n    task_class = Shouting\n"
    )
    archive = Archive.open(fake_archive(tmp_path, own), root=tmp_path / "unpacked")
    task, worker = archive.served_by()
    assert task.__name__ == "Shouting" and issubclass(task, EmbeddingTask) and worker is Worker
    mine = archive.handler_class()  # the file run again: classes of their own
    assert mine.served_task(parse(archive.yaml_config)) is mine.task_class
    assert Handler.served_task(parse({"handler": {"task": "embedding"}})) is EmbeddingTask


def test_archives_that_cannot_be_served_are_refused_with_the_reason(tmp_path):
    with pytest.raises(ArchiveError, match="every node"):
        Archive.open(tmp_path / "missing.mar")
    (tmp_path / "not.mar").write_text("text")
    with pytest.raises(ArchiveError, match="not a .mar"):
        Archive.open(tmp_path / "not.mar")
    escaping = tmp_path / "escaping"
    escaping.mkdir()
    with pytest.raises(ArchiveError, match="outside the archive"):
        Archive.open(fake_archive(escaping, member_names=["../evil.py"]), root=tmp_path / "unpacked")
    two = tmp_path / "two"
    two.mkdir()
    source = HANDLER.read_text() + "\n\nclass Second(Handler):\n    pass\n"
    with pytest.raises(ArchiveError, match="one subclass"):
        Archive.open(fake_archive(two, source), root=tmp_path / "unpacked").handler_class()


class ScriptedLoop:
    """A decode loop that answers by a script: per request id, its replies in order. Records each call."""

    def __init__(self, script: dict[str, list[Reply]]):
        self.script = script
        self.calls: list[list[tuple[str, bool]]] = []

    def call(self, requests):
        self.calls.append([(request_id, incoming is not None) for request_id, incoming in requests])
        return [self.script[request_id].pop(0) for request_id, _ in requests]


def test_the_driver_calls_the_loop_while_requests_are_open_and_hands_each_its_replies():
    script = {
        "0": [Reply("", last=False), Reply("a", last=False), Reply("b", last=True)],  # streamed over 3 calls
        "1": [Reply('{"error": "no"}', 400, last=None)],  # refused: one plain reply
    }
    loop = ScriptedLoop(script)

    async def run():
        driver = ContinuousRequests(loop, SimpleNamespace(executor=ThreadPoolExecutor(1)))

        async def collect(body):
            return [reply async for reply in driver.serve(Incoming(body))]

        return await asyncio.gather(collect("first"), collect("second"))

    first, second = asyncio.run(run())
    assert [reply.body for reply in first] == ["", "a", "b"]
    assert [(reply.status, reply.last) for reply in second] == [(400, None)]
    # Each new request's body goes to the loop once, then it is resent as None; an ended one is never resent.
    assert loop.calls == [[("0", True), ("1", True)], [("0", False)], [("0", False)]]


def test_a_client_that_leaves_is_no_longer_sent_to_the_loop():
    later = [Reply(text, last=False) for text in "xyz"] + [Reply("w", last=True)]
    loop = ScriptedLoop({"0": [Reply("", last=False)] * 4, "1": later})

    async def run():
        driver = ContinuousRequests(loop, SimpleNamespace(executor=ThreadPoolExecutor(1)))
        leaving = driver.serve(Incoming("left"))
        staying = asyncio.ensure_future(_all(driver.serve(Incoming("stays"))))
        await anext(leaving)
        await leaving.aclose()  # the client went away after its first reply
        return await staying

    assert [reply.body for reply in asyncio.run(run())] == ["x", "y", "z", "w"]
    assert all(request_id != "0" for request_id, _ in loop.calls[-1])


async def _all(replies):
    return [reply async for reply in replies]


def test_a_defect_in_the_loop_ends_every_open_request_with_a_500_in_its_routes_shape():
    refused_routes = []

    def refused(route, error, stage):  # the worker's: the route's protocol shapes the body
        refused_routes.append(route)
        failed = refusal(error, stage)
        return Reply(json.dumps(failed.body()), failed.status)

    class Broken:
        worker = SimpleNamespace(refused=refused)

        def call(self, requests):
            raise RuntimeError("a bug")

    async def run():
        driver = ContinuousRequests(Broken(), SimpleNamespace(executor=ThreadPoolExecutor(1)))
        return [reply async for reply in driver.serve(Incoming("x", route="v1/completions"))]

    (reply,) = asyncio.run(run())
    assert reply.status == 500 and "a bug" not in reply.body
    assert refused_routes == ["v1/completions"]
