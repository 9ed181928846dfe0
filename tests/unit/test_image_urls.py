"""Image URLs: fetched only from the origins `images.fetch_from` names, with no redirect followed,
within the time and byte limits; every failure a 4xx naming the image. Against a real HTTP server
on a free loopback port."""

import io

import numpy as np
import pytest
from image_server import png, serving_pictures
from PIL import Image

from ts_compiled_handlers.request.images import ImageLimits, decode_image
from ts_compiled_handlers.request.payload import RequestError
from ts_compiled_handlers.startup.config import parse
from ts_compiled_handlers.startup.config_values import ConfigError
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
        ("/moved", None, 400, "HTTP 302 (a redirect, not followed)"),
        ("/missing", None, 400, "HTTP 404"),
        ("/huge", None, 413, "is over 4096 bytes"),
        ("/endless", None, 413, "is over 4096 bytes"),
        ("/slow", None, 400, "could not be fetched (timed out after 1 s)"),
        ("/drip", None, 400, "could not be fetched (timed out after 1 s)"),
        ("/garbled", None, 400, "could not be fetched (BadStatusLine)"),  # a 500 once
    ],
)
def test_every_other_url_is_refused_by_name(image_server, path, limits, code, reason):
    limits = limits or ImageLimits(max_bytes=4096, fetch_from=(image_server,), fetch_seconds=1)
    error = refusal(image_server + path, limits)
    assert error.status == code and reason in error.message, error.message
    assert error.field == "image"


def test_the_allow_list_is_read_from_the_archive_config():
    config = parse({"handler": {"images": {"fetch_from": ["https://CDN.example.com", "http://127.0.0.1:9000/"]}}})
    assert config.images.fetch_from == ("https://cdn.example.com:443", "http://127.0.0.1:9000")
    assert parse({}).images.fetch_from == ()
    assert ImageTextTask(config).limits.fetch_from == config.images.fetch_from
    for bad in (["https://cdn.example.com/images"], ["ftp://cdn.example.com"], ["https://a.com?x=1"], "https://a.com"):
        with pytest.raises(ConfigError):
            parse({"handler": {"images": {"fetch_from": bad}}})
