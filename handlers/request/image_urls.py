"""Image URLs, fetched only from the origins the archive's config names (`images.fetch_from`).

Off by default: a worker that fetches whatever a request names can be made to reach inside its
network (SSRF). Where origins are named, a URL is fetched only if its scheme, host and port are one
of them, and then:
- its host is resolved once, and an address that is not global (loopback, private, link-local,
  multicast, reserved) is refused unless an allowed origin names that very address; the connection
  goes to the address resolved (TLS still checks the certificate against the name), so a second
  lookup cannot point it elsewhere;
- one deadline holds the whole fetch, name, connection, headers and body: at the deadline the
  socket is shut, whatever it waits on (a server that drips a byte a second is cut there);
- no redirect is followed (it could lead anywhere), and at most the bytes allowed are read;
- the request's URLs are fetched side by side under one deadline (`fetch_all`).
A refusal tells the client what it may know (not allowed, too large, too slow, no image there),
never the origin's status, reason or a socket error: those would map the network for a scanner.
The worker's log has them, with the origin and no path.
"""

import concurrent.futures
import http.client
import ipaddress
import logging
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

from ts_compiled_handlers.request.payload import RequestError

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {"http": 80, "https": 443}
READ_BYTES = 1 << 16


def origin_of(url: str) -> str | None:
    """`scheme://host:port`, lower case with the default port written, or None for no http(s) URL."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname or parts.username or parts.password:
        return None
    scheme = parts.scheme.lower()
    return f"{scheme}://{parts.hostname.lower()}:{port or DEFAULT_PORTS[scheme]}"


class FetchFailed(Exception):
    """What went wrong, for the worker's log only (the client is told less)."""


class Refused(Exception):
    """A fetch refused for a reason the client may know: its message is the client's."""


class TooLarge(Exception):
    """An answer that states, or sends, more bytes than the image may take."""


def allowed_addresses(fetch_from: tuple[str, ...]) -> set:
    """The addresses the allowed origins name as IP literals: the only non-global ones fetched."""
    named = set()
    for origin in fetch_from:
        try:
            named.add(ipaddress.ip_address(urlsplit(origin).hostname))
        except ValueError:
            continue
    return named


def checked_address(host: str, port: int, named: set) -> str:
    """The first address `host` resolves to, refused where it is not global and not named."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise FetchFailed(f"name not resolved ({type(error).__name__})") from None
    for *_, address in found:
        ip = ipaddress.ip_address(address[0].split("%")[0])
        ip = getattr(ip, "ipv4_mapped", None) or ip
        if (ip.is_global and not ip.is_multicast) or ip in named:
            return str(ip)
    raise Refused("its host resolves to an address images are not fetched from")


class PinnedHTTP(http.client.HTTPConnection):
    """A connection to the address resolved, not to a second lookup of its name."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self):
        self.sock = socket.create_connection((self.address, self.port), self.timeout)
        self.watched = self.sock.dup()  # for `Deadline.shut`: http.client closes `sock` once it reads a body


class PinnedHTTPS(http.client.HTTPSConnection):
    """TLS to the address resolved, its certificate checked against the name."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self):
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.watched = sock.dup()  # shut at the deadline, TLS or not
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class Deadline:
    """Shuts a connection's socket at the deadline, whatever call waits on it."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.passed = False
        self.connection = None
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self.shut)
        self.timer.daemon = True

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.passed = True
            raise TimeoutError
        return left

    def shut(self) -> None:
        self.passed = True
        sock = getattr(self.connection, "watched", None)  # shutting one descriptor shuts the connection
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def fetch_one(url: str, named: set, deadline: float, most: int) -> bytes:
    """The image at `url`, at most `most` bytes; else Refused, TooLarge, TimeoutError or FetchFailed."""
    parts = urlsplit(url.strip())
    scheme, host = parts.scheme.lower(), parts.hostname
    port = parts.port or DEFAULT_PORTS[scheme]
    clock = Deadline(deadline)
    address = checked_address(host, port, named)
    connection_class = PinnedHTTPS if scheme == "https" else PinnedHTTP
    clock.connection = connection_class(host, port, address, clock.left())
    clock.timer.start()
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        clock.connection.request("GET", path, headers={"Accept": "image/*"})
        answer = clock.connection.getresponse()
        if answer.status != 200:
            raise FetchFailed(f"HTTP {answer.status}")
        stated = answer.headers.get("Content-Length")
        if stated is not None and stated.isdigit() and int(stated) > most:
            raise TooLarge  # before the body comes
        data = read_until(answer, most + 1, clock)
        if len(data) > most:
            raise TooLarge
        return data
    except (OSError, ValueError, http.client.HTTPException) as error:  # TimeoutError is an OSError
        if clock.passed or isinstance(error, TimeoutError):  # shut at the deadline, or a wait that reached it
            raise TimeoutError from None
        raise FetchFailed(type(error).__name__) from error
    finally:
        clock.timer.cancel()
        clock.connection.close()
        if getattr(clock.connection, "watched", None) is not None:
            clock.connection.watched.close()


def read_until(answer, most: int, clock: Deadline) -> bytes:
    """At most `most` bytes of the body, in chunks, until the deadline shuts the socket."""
    chunks, size = [], 0
    while size < most:
        clock.left()
        chunk = answer.read(min(READ_BYTES, most - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if clock.passed:
        raise TimeoutError
    return b"".join(chunks)


def check_allowed(url: str, field: str, fetch_from: tuple[str, ...]) -> None:
    if origin_of(url) not in fetch_from:
        reason = "images are not fetched" if not fetch_from else "its host is not one images are fetched from"
        raise RequestError(400, f"'{field}' is a URL: {reason}; send its bytes as a data URI (base64)", field)


def fetch_all(urls: list[str], fields: list[str], limits, most: int) -> list[bytes]:
    """Each URL's bytes (at most `most` each, else its 413), fetched side by side within one
    `fetch_seconds` deadline; the first failure, in the request's order, is the request's RequestError."""
    for url, field in zip(urls, fields, strict=True):
        check_allowed(url, field, limits.fetch_from)
    deadline = time.monotonic() + limits.fetch_seconds
    named = allowed_addresses(limits.fetch_from)
    pool = concurrent.futures.ThreadPoolExecutor(len(urls), thread_name_prefix="image-fetch")
    try:
        futures = [pool.submit(fetch_one, url, named, deadline, most) for url in urls]
        concurrent.futures.wait(futures, timeout=limits.fetch_seconds + 1)  # a name lookup is not shut
        return [
            outcome(future, url, field, limits, most) for future, url, field in zip(futures, urls, fields, strict=True)
        ]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def outcome(future, url: str, field: str, limits, most: int) -> bytes:
    """The fetch's bytes, or the client's refusal for it (the detail logged)."""
    origin = origin_of(url)
    if not future.done():
        error = TimeoutError()
    else:
        error = future.exception()
    if error is None:
        return future.result()
    if isinstance(error, TooLarge):
        raise RequestError(413, f"'{field}' is over {most} bytes, the most this image may take", field)
    if isinstance(error, Refused):
        raise RequestError(400, f"'{field}' is a URL: {error}; send its bytes as a data URI (base64)", field)
    if isinstance(error, TimeoutError):
        logger.warning("An image fetch from %s passed its %s s deadline", origin, limits.fetch_seconds)
        raise RequestError(400, f"'{field}' could not be fetched (timed out after {limits.fetch_seconds} s)", field)
    logger.warning("An image fetch from %s failed: %s", origin, error)
    raise RequestError(
        400, f"'{field}' could not be fetched: its origin gave no image (no redirect is followed)", field
    )
