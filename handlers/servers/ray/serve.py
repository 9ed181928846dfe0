"""The same archive on Ray Serve, across nodes:
`serve run ts_compiled_handlers.servers.ray.serve:app archive=minilm.mar`.

`app` is a Ray Serve application builder (docs/scale-out.md): it opens the archive where it runs,
settles the key, sizes the deployment from the archive's bucket plan, and binds `ArchiveReplica`.
Each replica reads the archive from the same path on its own node (a shared or baked-in folder;
unpacked once per node, handlers/servers/archive.py), builds the worker exactly as a TorchServe worker does
(the archive's handler class names its task; its AOT package or compile cache is used as there),
and serves TorchServe's inference API (handlers/servers/inference_api.py) from its own event loop:

- encoder tasks through the token scheduler (handlers/loops/scheduled_requests.py): requests as they arrive, calls
  up to the token budget, no timer; Serve routes up to `max_ongoing_requests` to a replica, sized
  so that two full calls' worth of short requests can wait (within `scheduler.max_queue`);
- generation through continuous batching (handlers/loops/decode_loop_driver.py), streamed.

A replica takes traffic once its worker is built, warmed over its grid and checked: Serve routes to
a replica only after its constructor returns.
"""

import logging
import os
import secrets
from pathlib import Path
from typing import Any

import ray
from pydantic import BaseModel, ConfigDict
from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ts_compiled_handlers.loops.decode_loop import DecodeLoop
from ts_compiled_handlers.loops.decode_loop_driver import ContinuousRequests
from ts_compiled_handlers.loops.model_thread import ModelThread
from ts_compiled_handlers.loops.scheduled_requests import ScheduledRequests
from ts_compiled_handlers.servers import inference_api
from ts_compiled_handlers.servers.archive import Archive, show_worker_logs, with_threads
from ts_compiled_handlers.servers.ray.metrics_sink import RaySink
from ts_compiled_handlers.startup.config import parse
from ts_compiled_handlers.startup.serving import task_plan
from ts_compiled_handlers.worker.worker import Incoming, Reply

logger = logging.getLogger(__name__)

KEY_FOLDER = Path("~/.hfserve/ray-serve-keys")
KEY_ENV = "HFSERVE_API_KEY"


class AppArgs(BaseModel):
    """The builder's arguments (`serve run ... key=value`, a `serve deploy` YAML's `args`, or a dict)."""

    model_config = ConfigDict(extra="forbid")

    archive: str  # a .mar `hfserve build` made, at a path every node reads
    name: str | None = None  # default: the archive's model name
    num_replicas: int | None = None  # default 1; or Ray's own autoscaling_config
    autoscaling_config: dict[str, Any] | None = None
    api_key: str | None = None  # else $HFSERVE_API_KEY, else one generated once, in `key_file`
    key_file: str | None = None  # default ~/.hfserve/ray-serve-keys/NAME.key
    ray_actor_options: dict[str, Any] = {"num_cpus": 1}
    max_replicas_per_node: int | None = None
    max_ongoing_requests: int | None = None  # default: sized from the archive's token budget


def app(args: AppArgs) -> serve.Application:
    """The Serve application of one archive."""
    args = AppArgs.model_validate(args) if isinstance(args, dict) else args
    if args.num_replicas is not None and args.autoscaling_config is not None:
        raise ValueError("give num_replicas or autoscaling_config, not both")
    path = Path(args.archive).expanduser().resolve()
    archive = Archive.open(path)
    name = args.name or archive.model_name
    digest = inference_api.key_digest(api_key(args.api_key, args.key_file, name))
    ongoing = args.max_ongoing_requests or max_ongoing_requests(archive)
    options = {
        "name": name,
        "ray_actor_options": args.ray_actor_options,
        "max_ongoing_requests": ongoing,
        "max_replicas_per_node": args.max_replicas_per_node,
    }
    if args.autoscaling_config is not None:
        options["autoscaling_config"] = {"target_ongoing_requests": max(1, ongoing // 2), **args.autoscaling_config}
    else:
        options["num_replicas"] = args.num_replicas or 1
    return ArchiveReplica.options(**options).bind(str(path), name, digest)


def api_key(given: str | None, key_file: str | None, name: str) -> str:
    """The key clients send: given, else $HFSERVE_API_KEY, else the key file's (made once, mode 0600)."""
    if given or os.environ.get(KEY_ENV):
        return given or os.environ[KEY_ENV]
    path = Path(key_file or KEY_FOLDER / f"{name}.key").expanduser()
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(24) + "\n")
        logger.warning("A new API key for %s is in %s (mode 0600): send it as `Authorization: Bearer KEY`", name, path)
    else:
        logger.warning("The API key for %s is the one in %s", name, path)
    return path.read_text().strip()


def max_ongoing_requests(archive: Archive) -> int:
    """Requests Serve sends one replica at once: two full calls of the shortest bucket's requests
    (one in the model, one waiting), within what the scheduler holds; generation: two per slot."""
    config = parse(for_replica(archive.yaml_config, 1))
    plan = task_plan(archive.handler_class().task_class(config), config, archive.folder)
    if config.task == "text-generation":
        return 2 * plan.max_batch
    return max(1, min(config.scheduler.max_queue, 2 * plan.full_call_tokens // plan.seq_lens[0]))


def for_replica(yaml_config: dict, cpus: float) -> dict:
    """The archive's model-config.yaml as a replica serves it: requests one at a time (the token
    scheduler, or generation's continuous batching), and the replica's CPUs as its threads unless
    the archive fixes them."""
    adapted = {
        key: value
        for key, value in with_threads(yaml_config, cpus).items()
        if key not in ("batchSize", "maxBatchDelay")
    }
    adapted["minWorkers"] = 1
    if (adapted.get("handler") or {}).get("task") == "text-generation":
        adapted.update(continuousBatching=True, asyncCommunication=False)
    else:
        adapted.update(asyncCommunication=True)
    return adapted


def http_response(reply: Reply) -> Response:
    return Response(reply.body, reply.status, reply.headers, reply.content_type)


@serve.deployment(health_check_period_s=10)
class ArchiveReplica:
    """One worker of the archive, serving TorchServe's inference API."""

    async def __init__(self, archive_path: str, name: str, key_digest: str):
        archive = Archive.open(archive_path)
        show_worker_logs()
        handler = archive.handler_class()
        resources = ray.get_runtime_context().get_assigned_resources()
        gpu_id = 0 if resources.get("GPU") else None  # Ray shows a replica only the GPUs it was given
        placement = archive.placement(for_replica(archive.yaml_config, resources.get("CPU", 1)), name, gpu_id)
        sink = RaySink(name, serve.get_replica_context().replica_id.unique_id)
        model_thread, self.worker = ModelThread.start(handler.worker_class.build, placement, handler.task_class, sink)
        generation = self.worker.serving.config.continuous
        self.loop = (
            ContinuousRequests(DecodeLoop(self.worker), model_thread)
            if generation
            else ScheduledRequests(self.worker, model_thread)
        )
        self.name, self.version, self.key_digest = name, archive.model_version, key_digest

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if path.strip("/") == "ping":
            return http_response(inference_api.HEALTHY)
        if not inference_api.authorized(request.headers.get("authorization"), self.key_digest):
            return http_response(inference_api.unauthorized())
        route = inference_api.route_of(path)
        refused = inference_api.refusal(path, request.method, route, self.name, self.version)
        if refused is not None:
            return http_response(refused)
        incoming = Incoming(await request.body() or None, request.headers.get("content-type"), route.path)
        if isinstance(self.loop, ScheduledRequests):
            return http_response(await self.loop.serve(incoming))
        return await streamed(self.loop.serve(incoming))


async def streamed(replies) -> Response:
    """A generation request's replies: one plain response, or its chunks streamed."""
    first = await anext(replies)
    if first.last is None:
        return http_response(first)

    async def chunks():
        yield first.body
        async for reply in replies:
            yield reply.body

    return StreamingResponse(chunks(), first.status, first.headers, first.content_type)
