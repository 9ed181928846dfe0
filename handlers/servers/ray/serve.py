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
a replica only after its constructor returns. A body is held to `max_request_size`, as TorchServe's
frontend holds it (Content-Length first, then the bytes as they arrive: 413 past it, the rest
unread), and an encoder replica at its queue limit answers 503 before reading the body.
"""

import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

import ray
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ts_compiled_handlers.configuration.config import GENERATION, HandlerConfig, parse
from ts_compiled_handlers.configuration.placement import Placement
from ts_compiled_handlers.loops.scheduled_requests import FULL
from ts_compiled_handlers.loops.start import start
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.runtime.tracing import TRACE_HEADERS
from ts_compiled_handlers.servers import inference_api
from ts_compiled_handlers.servers.archive import Archive, show_worker_logs, with_threads
from ts_compiled_handlers.servers.ray.metrics_sink import RaySink
from ts_compiled_handlers.startup.bucket_plan import task_plan
from ts_compiled_handlers.worker.messages import Incoming, Reply

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
    key_file: str | None = None  # default ~/.hfserve/ray-serve-keys/NAME.key; made once if missing
    ray_actor_options: dict[str, Any] = {"num_cpus": 1}
    max_replicas_per_node: int | None = None
    max_ongoing_requests: int | None = None  # default: sized from the archive's token budget
    max_request_size: int = Field(inference_api.MAX_REQUEST_SIZE, gt=0)  # a longer body gets 413, as on TorchServe


def app(args: AppArgs) -> serve.Application:
    """The Serve application of one archive."""
    args = AppArgs.model_validate(args) if isinstance(args, dict) else args
    if args.num_replicas is not None and args.autoscaling_config is not None:
        raise ValueError("give num_replicas or autoscaling_config, not both")
    path = Path(args.archive).expanduser().resolve()
    archive = Archive.open(path)
    name = args.name or archive.model_name
    digest = inference_api.key_digest(api_key(args.key_file, name))
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
    return ArchiveReplica.options(**options).bind(str(path), name, digest, args.max_request_size)


def api_key(key_file: str | None, name: str) -> str:
    """The key clients send: $HFSERVE_API_KEY, else the key file's (made once, mode 0600); never an
    argument, which would stay in the command line and in Serve's stored config. Stripped wherever
    it comes from, as the header's is: a Kubernetes Secret made with --from-file keeps the file's
    newline, and every request would get 401."""
    if os.environ.get(KEY_ENV, "").strip():
        return os.environ[KEY_ENV].strip()
    return file_key(Path(key_file or KEY_FOLDER / f"{name}.key").expanduser(), name)


def file_key(path: Path, name: str) -> str:
    """The key in `path`, made first if there is none; a file others may read is used, with a warning."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(24) + "\n")
        logger.warning("A new API key for %s is in %s (mode 0600): send it as `Authorization: Bearer KEY`", name, path)
    else:
        logger.warning("The API key for %s is the one in %s", name, path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o044:
        logger.warning("%s can be read by its group or by everyone (mode %03o): `chmod 600` it", path, mode)
    key = path.read_text().strip()
    if not key:  # an empty key would let `Authorization: Bearer ` in
        raise ValueError(f"{path} holds no key: write one in it, or remove it to have one made")
    return key


def max_ongoing_requests(archive: Archive) -> int:
    """Requests Serve sends one replica at once: two full calls of the shortest bucket's requests
    (one in the model, one waiting), within what the scheduler holds; generation: two per slot."""
    placement, config = for_replica(archive, 1)
    task_class, _ = archive.served_by()
    plan = task_plan(task_class(config, continuous=placement.continuous), config, archive.folder)
    if placement.continuous:
        return 2 * plan.max_batch
    return max(1, min(config.scheduler.max_queue, 2 * plan.full_call_tokens // plan.seq_lens[0]))


def for_replica(
    archive: Archive, cpus: float, name: str | None = None, gpu_id: int | None = None
) -> tuple[Placement, HandlerConfig]:
    """Where a replica's worker sits, and its configuration: requests one at a time (the token
    scheduler, or generation's decode loop), the replica's CPUs as its threads unless the archive
    fixes them. TorchServe's own keys of the archive (batching, workers) are not read: Serve routes
    the requests and counts the replicas."""
    yaml_config = with_threads(archive.yaml_config, cpus)
    config = parse(yaml_config)  # once per replica
    continuous = config.task == GENERATION
    return archive.placement(yaml_config, name, gpu_id, one_at_a_time=True, continuous=continuous), config


def start_replica(archive: Archive, name: str, cpus: float, gpu_id: int | None, sink) -> tuple:
    """A replica's worker and its loop (the token scheduler, or the decode loop and its driver)."""
    placement, config = for_replica(archive, cpus, name, gpu_id)
    task_class, worker_class = archive.served_by()
    return start(placement, config, task_class, sink, worker_class)


def http_response(reply: Reply) -> Response:
    return Response(reply.body, reply.status, reply.headers, reply.content_type)


@serve.deployment(health_check_period_s=10)
class ArchiveReplica:
    """One worker of the archive, serving TorchServe's inference API."""

    async def __init__(
        self, archive_path: str, name: str, key_digest: str, max_request_size: int = inference_api.MAX_REQUEST_SIZE
    ):
        archive = Archive.open(archive_path)
        show_worker_logs()
        resources = ray.get_runtime_context().get_assigned_resources()
        gpu_id = 0 if resources.get("GPU") else None  # Ray shows a replica only the GPUs it was given
        sink = RaySink(name, serve.get_replica_context().replica_id.unique_id)
        self.worker, self.loop = start_replica(archive, name, resources.get("CPU", 1), gpu_id, sink)
        self.name, self.version, self.key_digest = name, archive.model_version, key_digest
        self.max_request_size = max_request_size

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
        try:
            incoming = await self.incoming(request, route.path)
        except RequestError as error:
            return http_response(self.worker.refused(route.path, error, "preprocess"))
        return await streamed(self.loop.serve(incoming))

    async def incoming(self, request: Request, route: str) -> Incoming:
        """The request with its body, read within `max_request_size` (413 past it); at a full queue,
        a 503 before any of the body is read."""
        if self.loop.full:
            raise RequestError(503, FULL)
        length = request.headers.get("content-length")
        body = await inference_api.read_body(request.stream(), length, self.max_request_size)
        traced = {name: request.headers[name] for name in TRACE_HEADERS if name in request.headers}
        return Incoming(
            body or None, request.headers.get("content-type"), route, traced if self.worker.tracer else None
        )


async def streamed(replies) -> Response:
    """What the loop yields for a request: one plain reply (`last` None), or generation's chunks, streamed."""
    first = await anext(replies)
    if first.last is None:
        await replies.aclose()
        return http_response(first)

    async def chunks():
        yield first.body
        async for reply in replies:
            yield reply.body

    return StreamingResponse(chunks(), first.status, first.headers, first.content_type)
