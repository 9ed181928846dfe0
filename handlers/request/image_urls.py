"""Image URLs, fetched only from the origins the archive's config names (`images.fetch_from`).

Off by default: a worker that fetches whatever a request names can be made to reach inside its
network (SSRF). Where origins are named, a URL is fetched only if its scheme, host and port are one
of them, with no redirect followed (it could lead anywhere), within `images.fetch_seconds` (checked
between reads, each of which may wait that long: a server that drips its bytes holds a fetch twice
that at most), and at most the image byte limit is read: a longer body, or a `Content-Length` over
it, is refused before the rest arrives. What comes back is then decoded as a sent image is
(handlers/request/images.py).
"""

import http.client
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from ts_compiled_handlers.request.payload import RequestError

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


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, "a redirect, not followed", headers, fp)


OPENER = urllib.request.build_opener(NoRedirects)


def fetch_image(url: str, field: str, fetch_from: tuple[str, ...], seconds: int, max_bytes: int) -> bytes:
    """The bytes at `url`, if its origin is allowed; else, or on any failure, a RequestError naming why."""
    if origin_of(url) not in fetch_from:
        reason = "images are not fetched" if not fetch_from else "its host is not one images are fetched from"
        raise RequestError(400, f"'{field}' is a URL: {reason}; send its bytes as a data URI (base64)", field)
    deadline = time.monotonic() + seconds
    try:
        with OPENER.open(urllib.request.Request(url, headers={"Accept": "image/*"}), timeout=seconds) as answer:
            stated = answer.headers.get("Content-Length")
            if stated is not None and stated.isdigit() and int(stated) > max_bytes:
                raise RequestError(413, f"'{field}' is over {max_bytes} bytes, the most an image may take", field)
            data = read_until(answer, max_bytes + 1, deadline)
    except urllib.error.HTTPError as error:
        raise RequestError(400, f"'{field}' could not be fetched: HTTP {error.code} ({error.msg})", field) from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as error:
        # refused, unresolved, timed out, cut short, or not HTTP (a bad status line, an over-long header)
        reason = getattr(error, "reason", error)
        what = f"timed out after {seconds} s" if isinstance(reason, TimeoutError) else type(reason).__name__
        raise RequestError(400, f"'{field}' could not be fetched ({what})", field) from None
    if len(data) > max_bytes:
        raise RequestError(413, f"'{field}' is over {max_bytes} bytes, the most an image may take", field)
    return data


def read_until(answer, most: int, deadline: float) -> bytes:
    """At most `most` bytes of the body, in chunks; TimeoutError once `deadline` has passed."""
    chunks, size = [], 0
    while size < most:
        if time.monotonic() > deadline:
            raise TimeoutError
        chunk = answer.read(min(READ_BYTES, most - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
