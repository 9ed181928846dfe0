"""A real HTTP server of pictures on a free loopback port, for the image URL tests."""

import contextlib
import http.server
import io
import threading
import time

import numpy as np
from PIL import Image


def png(seed: int = 0) -> bytes:
    pixels = (np.random.default_rng(seed).random((30, 40, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "PNG")
    return out.getvalue()


SENT = {}  # path -> bytes the dripping answers had written when the client went away
HOSTS = []  # the Host header of each request, in order


class Pictures(http.server.BaseHTTPRequestHandler):
    """/cat.png an image; /moved a redirect to it; /huge a Content-Length over the limit; /endless
    a body with no length that runs past it; /slow an answer after 3 s; /drip a body sent a byte at
    a time; /drip-body and /drip-headers a byte every 0.2 s for 20 s, of the body or the headers,
    counting what was written (`SENT`); /garbled a reply that is not HTTP; anything else 404."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        HOSTS.append(self.headers.get("Host"))
        if self.path in ("/drip-body", "/drip-headers"):
            self.drip(self.path)
        elif self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.end_headers()
        elif self.path in ("/cat.png", "/slow"):
            if self.path == "/slow":
                time.sleep(3)
            self.answer(png(), len(png()))
        elif self.path == "/drip":  # a byte every 0.3 s: each read in time, the whole fetch not
            self.send_response(200)
            self.send_header("Content-Length", "20")
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(20):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.3)
        elif self.path == "/garbled":  # no status line: http.client raises BadStatusLine
            with contextlib.suppress(OSError):
                self.wfile.write(b"SSH-2.0-OpenSSH\r\n\r\n")
                self.close_connection = True
        elif self.path == "/huge":
            self.answer(b"x" * 10, 10**9)
        elif self.path == "/endless":
            self.send_response(200)
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(b"\0" * 5000)
        else:
            self.send_error(404)

    def drip(self, path: str) -> None:
        """A byte every 0.2 s, 100 of them, after the status line (headers) or the headers (body)."""
        self.wfile.write(b"HTTP/1.0 200 OK\r\n")
        if path == "/drip-body":
            self.wfile.write(b"Content-Type: image/png\r\nContent-Length: 100\r\n\r\n")
        SENT[path] = 0
        with contextlib.suppress(OSError):
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                SENT[path] += 1
                time.sleep(0.2)
        self.close_connection = True

    def answer(self, data: bytes, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client may stop reading at its limit
            self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving_pictures():
    """The server's origin, `http://127.0.0.1:PORT`, while the block runs."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pictures)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
