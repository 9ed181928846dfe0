"""Image URLs: fetched only from the origins `images.fetch_from` names, with no redirect followed,
within the time and byte limits; every failure a 4xx naming the image. Against a real HTTP server
on a free loopback port."""

import io
import ipaddress
import socket
import time

import image_server as image_server_module
import numpy as np
import pytest
from image_server import png, serving_pictures
from PIL import Image

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.configuration.config_values import ConfigError
from ts_compiled_handlers.request.image_urls import allowed_addresses
from ts_compiled_handlers.request.images import ImageLimits, decode_image, request_bytes
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.tasks.image_text import ImageTextTask


@pytest.fixture(scope="module")
def image_server():
    with serving_pictures() as origin:
        yield origin


def refusal(url: str, limits: ImageLimits) -> RequestError:
    with pytest.raises(RequestError) as error:
        decode_image(url, "image", limits)
    return error.value


def test_an_allowed_origins_image_is_fetched_and_decoded(image_server):
    image = decode_image(f"{image_server}/cat.png", "image", ImageLimits(fetch_from=(image_server,)))
    assert image.size == (40, 30)
    np.testing.assert_array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(png())).convert("RGB")))


@pytest.mark.parametrize(
    "path, limits, code, reason",
    [
        ("/cat.png", ImageLimits(), 400, "images are not fetched"),
        ("/cat.png", ImageLimits(fetch_from=("http://127.0.0.2:80",)), 400, "its host is not one"),
        ("/moved", None, 400, "its origin gave no image (no redirect is followed)"),
        ("/missing", None, 400, "its origin gave no image"),
        ("/huge", None, 413, "is over 4096 bytes"),
        ("/endless", None, 413, "is over 4096 bytes"),
        ("/slow", None, 400, "could not be fetched (timed out after 1 s)"),
        ("/drip", None, 400, "could not be fetched (timed out after 1 s)"),
        ("/garbled", None, 400, "its origin gave no image"),  # a 500 once; its exception's name, a scanner's oracle
    ],
)
def test_every_other_url_is_refused_by_name(image_server, path, limits, code, reason, caplog):
    limits = limits or ImageLimits(max_bytes=4096, fetch_from=(image_server,), fetch_seconds=1)
    error = refusal(image_server + path, limits)
    assert error.status == code and reason in error.message, error.message
    assert error.field == "image"
    assert "HTTP" not in error.message and "Error" not in error.message and "Status" not in error.message
    if path in ("/moved", "/missing", "/garbled"):  # the worker's log says what the client is not told
        assert any(word in caplog.text for word in ("HTTP 302", "HTTP 404", "BadStatusLine")), caplog.text


@pytest.mark.parametrize("path", ["/drip-body", "/drip-headers"])
def test_one_deadline_cuts_a_dripping_origin_in_its_headers_or_its_body(image_server, path):
    """A byte every 0.2 s for 20 s: each read is in time, the whole fetch is not. The socket is shut
    at the deadline, so the origin has written a few bytes of its 100 when it notices."""
    error = refusal(image_server + path, ImageLimits(fetch_from=(image_server,), fetch_seconds=1))
    assert error.status == 400 and "timed out after 1 s" in error.message
    for _ in range(40):  # the origin notices at its next write
        time.sleep(0.1)
        if image_server_module.SENT.get(path, 0) < 20:
            break
    time.sleep(0.5)
    assert image_server_module.SENT[path] < 20, image_server_module.SENT


def test_a_requests_urls_are_fetched_side_by_side_within_one_deadline(image_server):
    """Three answers that each take 3 s, under a 5 s deadline: one after another they could not."""
    limits = ImageLimits(fetch_from=(image_server,), fetch_seconds=5)
    fields = [f"input[{index}]" for index in range(3)]
    datas = request_bytes([f"{image_server}/slow"] * 3, fields, limits)
    assert datas == [png()] * 3


def test_urls_and_their_bytes_are_capped_per_request(image_server):
    limits = ImageLimits(fetch_from=(image_server,), max_urls=2)
    with pytest.raises(RequestError, match=r"names 3 image URLs; at most 2 \(images.max_urls\)") as error:
        request_bytes([f"{image_server}/cat.png"] * 3, ["a", "b", "c"], limits)
    assert error.value.status == 413
    # Two URLs share what the sent image leaves of the request's bytes: each gets less than the picture.
    sent = b"\x89PNG" + b"\0" * 1000
    limits = ImageLimits(fetch_from=(image_server,), request_bytes=len(sent) + len(png()))
    with pytest.raises(RequestError, match="the most this image may take") as error:
        request_bytes([sent, f"{image_server}/cat.png", f"{image_server}/cat.png"], ["a", "b", "c"], limits)
    assert error.value.status == 413 and error.value.field == "b"


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254", "100.64.0.1", "224.0.0.1",
     "0.0.0.0", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1"],
)  # fmt: skip
def test_an_allowed_name_that_resolves_inside_the_network_is_refused(monkeypatch, address):
    """Loopback, private, link-local (a cloud's metadata service), shared, multicast, unspecified,
    and each of them written as IPv4 in IPv6: none is fetched, and no connection is opened."""
    monkeypatch.setattr(socket, "getaddrinfo", lambda *args, **kwargs: [(None, None, 6, "", (address, 80))])
    monkeypatch.setattr(socket, "create_connection", lambda *args, **kwargs: pytest.fail("connected"))
    error = refusal("http://images.example.com/cat.png", ImageLimits(fetch_from=("http://images.example.com:80",)))
    assert error.status == 400 and "resolves to an address images are not fetched from" in error.message


def test_an_address_the_allow_list_names_is_fetched_and_a_global_one_passes_the_check():
    named = allowed_addresses(("http://10.1.2.3:8000", "https://cdn.example.com:443"))
    assert named == {ipaddress.ip_address("10.1.2.3")}
    assert ipaddress.ip_address("93.184.216.34").is_global  # what checked_address lets through unnamed


def test_the_connection_goes_to_the_address_resolved_once(image_server, monkeypatch):
    """A name resolved once: a second lookup (DNS rebinding) would answer an address inside the
    network, but the connection goes to the first answer, and the request names the host."""
    port = int(image_server.rsplit(":", 1)[1])
    lookups = []
    resolve = socket.getaddrinfo

    def rebinding(host, *args, **kwargs):
        if host == "pictures.test":
            lookups.append(host)
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1" if len(lookups) == 1 else "10.9.9.9", port))
            ]
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    limits = ImageLimits(fetch_from=(f"http://pictures.test:{port}", image_server))
    image = decode_image(f"http://pictures.test:{port}/cat.png", "image", limits)
    assert image.size == (40, 30) and lookups == ["pictures.test"]
    assert image_server_module.HOSTS[-1] == f"pictures.test:{port}"


def test_the_allow_list_is_read_from_the_archive_config():
    config = parse({"handler": {"images": {"fetch_from": ["https://CDN.example.com", "http://127.0.0.1:9000/"]}}})
    assert config.images.fetch_from == ("https://cdn.example.com:443", "http://127.0.0.1:9000")
    assert parse({}).images.fetch_from == ()
    assert ImageTextTask(config).limits.fetch_from == config.images.fetch_from
    for bad in (["https://cdn.example.com/images"], ["ftp://cdn.example.com"], ["https://a.com?x=1"], "https://a.com"):
        with pytest.raises(ConfigError):
            parse({"handler": {"images": {"fetch_from": bad}}})
