"""TorchServe's inference API outside TorchServe: its paths, its key check and its errors, so that a
client of a model on TorchServe changes only the host and port to reach the same archive elsewhere
(a Ray Serve replica, handlers/servers/ray/serve.py).

    GET /ping                                            {"status": "Healthy"}, without a key
    POST|GET /predictions/{name}[/{version}[/{path}]]    the archive's protocols; `path` is the route
    POST /v2/models/{name}[/versions/{version}]/infer    KServe v2's path (its body: the v2 protocol)

Every other request needs `Authorization: Bearer KEY`. Only the key's SHA-256 travels to the
servers that check it, never the key itself. A body is held to TorchServe's `max_request_size`
(`read_body`): one client's body must not run a server out of memory.
"""

import dataclasses
import hashlib
import hmac
import json
from collections.abc import AsyncIterable

from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.worker.messages import Reply

HEALTHY = Reply(json.dumps({"status": "Healthy"}))
MAX_REQUEST_SIZE = 6_553_500  # TorchServe's default max_request_size, in bytes


@dataclasses.dataclass(frozen=True)
class Route:
    """A request's model, version (None: the default) and route (the path after the version)."""

    name: str
    version: str | None
    path: str


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def authorized(header: str | None, digest: str) -> bool:
    """Whether the Authorization header carries the key whose digest is `digest` (in constant time)."""
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(key_digest(token.strip()), digest)


def route_of(path: str) -> Route | None:
    """The route of a /predictions or KServe v2 path (None for any other path)."""
    parts = path.strip("/").split("/")
    if parts[:2] == ["v2", "models"] and len(parts) in (4, 6) and parts[-1] == "infer":
        versioned = len(parts) == 6 and parts[3] == "versions"
        return Route(parts[2], parts[4] if versioned else None, "") if versioned or len(parts) == 4 else None
    if len(parts) < 2 or parts[0] != "predictions" or not parts[1]:
        return None
    version = parts[2] if len(parts) > 2 and parts[2] else None
    return Route(parts[1], version, "/".join(parts[3:]).strip("/"))


def error(status: int, kind: str, message: str) -> Reply:
    """An error in TorchServe's frontend's shape."""
    return Reply(json.dumps({"code": status, "type": kind, "message": message}), status)


def refusal(path: str, method: str, route: Route | None, name: str, version: str) -> Reply | None:
    """The frontend's own answer to a request that never reaches the model (None: it does)."""
    if route is None:
        return error(404, "ResourceNotFoundException", f"Requested resource is not found: {path}")
    if method not in ("GET", "POST", "PUT"):
        return error(405, "MethodNotAllowedException", f"{method} is not allowed on {path}")
    if route.name != name:
        return error(404, "ModelNotFoundException", f"Model not found: {route.name}")
    if route.version not in (None, version):
        return error(
            404, "ModelVersionNotFoundException", f"Model version: {route.version} does not exist for model: {name}"
        )
    return None


async def read_body(chunks: AsyncIterable[bytes], content_length: str | None, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to pass `limit` bytes: by its Content-Length
    before any of it is read, else (a chunked body states none) once what was read passes it, the
    rest left unread."""
    if content_length is not None:
        stated = content_length.strip()
        if not (stated.isascii() and stated.isdigit()):
            raise RequestError(400, "Content-Length is not a number of bytes")
        if len(stated) > len(str(limit)) or int(stated) > limit:
            raise too_large(limit)
    read, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        read.append(chunk)
    return b"".join(read)


def too_large(limit: int) -> RequestError:
    return RequestError(413, f"request body is over {limit} bytes (max_request_size)")


def unauthorized() -> Reply:
    reply = error(401, "Unauthorized", "Token Authorization failed: send the key as `Authorization: Bearer KEY`")
    reply.headers["WWW-Authenticate"] = "Bearer"
    return reply
