"""A request's images budgeted before any is decoded (count, bytes, the pixels their headers
claim), each image's decoding bounded (a large JPEG decoded at a reduced DCT scale, a progressive
JPEG's scans counted, an animation refused from its header), EXIF orientation applied as
transformers' `load_image` applies it, and the images a worker holds counted against its budget."""

import io

import numpy as np
import pytest
from PIL import Image
from transformers.image_utils import load_image

from ts_compiled_handlers.request import images as images_module
from ts_compiled_handlers.request.holding import held_images
from ts_compiled_handlers.request.images import ImageLimits, decode_image, read_images
from ts_compiled_handlers.request.payload import RequestError


def photo(size=(400, 300), image_format="PNG", seed=0, **save) -> bytes:
    """A smooth picture with some noise, as a photo is (pure noise drafts badly, as no photo does)."""
    width, height = size
    x, y = np.meshgrid(np.linspace(0, 1, width), np.linspace(0, 1, height))
    rng = np.random.default_rng(seed)
    pixels = np.stack([x, y, (x + y) / 2], axis=-1) * 200 + rng.random((height, width, 3)) * 40
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8), "RGB").save(out, image_format, **save)
    return out.getvalue()


def palette_png(side: int) -> bytes:
    """A 1-bit palette PNG: a few KB that decode to side x side pixels."""
    out = io.BytesIO()
    Image.new("P", (side, side)).save(out, "PNG", bits=1, optimize=True)
    return out.getvalue()


def refused(values, limits, draft_to=None) -> RequestError:
    with pytest.raises(RequestError) as error:
        list(read_images(values, [f"input[{index}]" for index in range(len(values))], limits, draft_to))
    return error.value


def test_the_pixels_all_headers_claim_are_refused_before_any_is_decoded(monkeypatch):
    """64 palette PNGs of 6324 x 6324 (40 megapixels each, 5 KB each): a minute of decoding once."""
    bomb = palette_png(6324)
    assert len(bomb) < 10_000
    decoded = []
    monkeypatch.setattr(images_module, "rgb", lambda image, field: decoded.append(field))
    error = refused([bomb] * 64, ImageLimits())
    assert (
        error.status == 413
        and f"decode to {64 * 6324**2} pixels; at most 64000000 (images.request_pixels)" in error.message
    )
    assert decoded == []  # not one of them


def test_count_bytes_and_pixels_are_budgeted_per_request():
    small = photo((40, 30))
    error = refused([small] * 65, ImageLimits())
    assert error.status == 413 and "has 65 images; at most 64 (images.max_images)" in error.message
    error = refused([small] * 3, ImageLimits(request_bytes=2 * len(small)))
    assert error.status == 413 and "(images.request_bytes)" in error.message
    error = refused([photo((100, 100))], ImageLimits(max_pixels=9999))
    assert error.status == 413 and "at most 9999 pixels are decoded (images.max_pixels)" in error.message
    assert len(list(read_images([small] * 64, ["x"] * 64, ImageLimits()))) == 64


def test_the_images_are_decoded_one_at_a_time():
    """A generator: the request's full-size images are never all held at once."""
    pictures = read_images([photo()] * 3, ["a", "b", "c"], ImageLimits())
    first = next(pictures)
    assert first.size == (400, 300) and first.mode == "RGB"
    assert len(list(pictures)) == 2


def test_a_large_jpeg_is_decoded_at_the_scale_the_processor_needs():
    """4000 x 3000 for a processor that makes 224: decoded at 1/4 (1000 x 750), the smallest DCT
    scale that still covers twice 224 on both sides, and counted in the request's pixels at that size."""
    jpeg = photo((4000, 3000), "JPEG", quality=90)
    image = decode_image(jpeg, "image", ImageLimits(), draft_to=(448, 448))
    assert image.size == (1000, 750)
    assert decode_image(jpeg, "image", ImageLimits()).size == (4000, 3000)  # no processor size: whole
    assert len(list(read_images([jpeg] * 4, list("abcd"), ImageLimits(request_pixels=3_000_000), (448, 448)))) == 4
    # What the model sees: the drafted picture resized to 224 against the whole one resized to 224.
    drafted = np.asarray(image.resize((224, 168), Image.Resampling.BICUBIC), dtype=np.float32)
    whole = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB").resize((224, 168), Image.Resampling.BICUBIC))
    assert np.abs(drafted - whole).mean() < 3  # of 255 levels
    small = photo((600, 400), "JPEG")
    assert decode_image(small, "image", ImageLimits(), draft_to=(448, 448)).size == (600, 400)


def test_a_progressive_jpeg_with_more_scans_than_allowed_is_refused():
    progressive = photo((200, 150), "JPEG", progressive=True)
    scans = progressive.count(b"\xff\xda")
    assert scans > 3
    error = refused([progressive], ImageLimits(max_scans=3))
    assert error.status == 413 and f"a JPEG of {scans} scans; at most 3" in error.message
    assert decode_image(progressive, "image", ImageLimits()).size == (200, 150)
    assert photo((200, 150), "JPEG").count(b"\xff\xda") == 1  # a baseline JPEG: one scan


def test_an_animation_is_refused_without_walking_its_frames(monkeypatch):
    frames = [Image.new("RGB", (20, 20), (index * 10, 0, 0)) for index in range(50)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    seeks = []
    seek = Image.open(io.BytesIO(out.getvalue())).__class__.seek
    monkeypatch.setattr(
        Image.open(io.BytesIO(out.getvalue())).__class__,
        "seek",
        lambda self, frame: seeks.append(frame) or seek(self, frame),
    )
    error = refused([out.getvalue()], ImageLimits())
    assert error.status == 400 and "animated GIF; send one frame" in error.message
    assert max(seeks, default=0) <= 1  # `n_frames` seeks to the last of the 50


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_applied_as_transformers_load_image_applies_it(orientation):
    """A phone's photo stored sideways with the tag that says so: the same pixels as the pipeline's."""
    image = Image.open(io.BytesIO(photo((64, 48))))
    exif = image.getexif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif.tobytes(), quality=95)
    ours = decode_image(out.getvalue(), "image")
    theirs = load_image(Image.open(io.BytesIO(out.getvalue())))
    assert ours.size == theirs.size == ((48, 64) if orientation in (6, 8) else (64, 48))
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def test_held_images_are_counted_and_given_back():
    held = held_images(10)
    held.take(6, "images")
    with pytest.raises(RequestError) as error:
        held.take(5, "images")
    assert error.value.status == 503 and "would pass images.batch_images (10)" in error.value.message
    with held.holding(4, "images"):
        assert held.held == 10
    assert held.held == 6
    held.take(0, "images")  # a request without images is never refused
    with pytest.raises(RequestError) as error:
        held_images(10).take(11, "images")  # it could never fit: not a 503, which says "send it again"
    assert error.value.status == 413 and "holds at most 10 (images.batch_images)" in error.value.message


def test_the_draft_size_is_twice_what_the_processor_makes():
    from types import SimpleNamespace

    from transformers.image_utils import SizeDict

    from ts_compiled_handlers.tasks.image_text import draft_size

    assert draft_size(SimpleNamespace(size=SizeDict(shortest_edge=224))) == (448, 448)  # CLIP
    assert draft_size(SimpleNamespace(size=SizeDict(height=384, width=512))) == (1024, 768)  # SigLIP's kind
    assert draft_size(SimpleNamespace(size=SizeDict(longest_edge=1024))) is None  # another rule: decoded whole
