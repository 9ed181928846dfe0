"""Images from a request, decoded under limits set before any pixel is decoded.

An image comes as a data URI (`data:image/png;base64,...`), as bare base64, or as raw bytes (a
binary body). Its bytes are counted before they are decoded from base64; Pillow then reads only
the header, and the format, animation, colour mode, scans (a progressive JPEG's) and width x
height are checked before the pixels are decoded, so a few-KB PNG that claims 20,000 x 20,000
pixels is refused without its 1.2 GB being allocated. A request's images are budgeted together
(`read_images`): their count, their bytes, and the pixels all their headers claim, before any is
decoded; then they are decoded one at a time. A JPEG much larger than the model's processor needs
is decoded at a reduced scale (libjpeg's DCT scaling, `draft`), which the processor shrinks anyway.
EXIF orientation is applied as transformers' `load_image` applies it. A URL is fetched only from
an origin the archive's config names (handlers/request/image_urls.py); by default none, and an
image must travel in the request. Every refusal is a RequestError naming the reason and the limit,
for that image's request alone.
"""

import base64
import binascii
import dataclasses
import io
import re
import warnings

from ts_compiled_handlers.request.image_urls import fetch_all
from ts_compiled_handlers.request.payload import RequestError

# Formats a browser or camera sends; TIFF, ICO, PSD and the rest are refused by name.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
# Colour modes converted to RGB as the model's processor would; CMYK (print JPEGs) and others are
# refused: their conversion to RGB depends on a colour profile the request does not carry.
MODES = ("RGB", "RGBA", "L", "LA", "P", "I;16", "I")
DATA_URI = re.compile(r"data:image/[a-z0-9.+-]+;base64,", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ImageLimits:
    """What one image and one request's images may take (`images:` in the archive's config,
    handlers/configuration/image_config.py, says why each default): bytes as sent (before base64 is decoded: 4/3
    of them), pixels decoded, how many times longer than wide (or wide than high) an image may be (a
    processor that scales the shorter side to 224 would make a 40,000,000 x 1 strip, a 155 KB PNG,
    gigabytes of pixels) and a progressive JPEG's scans (each one a pass over every pixel)."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    max_aspect: int = 100
    max_scans: int = 100
    max_images: int = 64
    request_pixels: int = 64_000_000
    request_bytes: int = 32 << 20
    fetch_from: tuple[str, ...] = ()  # origins whose URLs are fetched (`images.fetch_from`)
    fetch_seconds: int = 5
    max_urls: int = 8

    @classmethod
    def of(cls, images) -> "ImageLimits":
        """From the config's `images:` section."""
        names = {field.name for field in dataclasses.fields(cls)} & {field.name for field in dataclasses.fields(images)}
        return cls(**{name: getattr(images, name) for name in names})


def is_url(value) -> bool:
    return isinstance(value, str) and value[:8].lower().startswith(("http://", "https://"))


def image_bytes(value, field: str, limits: ImageLimits) -> bytes:
    """The image's bytes, from a data URI, bare base64, raw bytes or an allowed origin's URL."""
    if isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    elif is_url(value):
        data = fetch_all([value], [field], limits, limits.max_bytes)[0]
    elif isinstance(value, str):
        data = _base64_bytes(value, field, limits)
    else:
        raise RequestError(400, f"'{field}' must be an image: a data URI or base64 text", field)
    if len(data) > limits.max_bytes:
        raise RequestError(413, f"'{field}' is over {limits.max_bytes} bytes, the most an image may take", field)
    if not data:
        raise RequestError(400, f"'{field}' is empty", field)
    return data


def _base64_bytes(value: str, field: str, limits: ImageLimits) -> bytes:
    if value[:5].lower().startswith(("file:", "ftp:")):
        raise RequestError(400, f"'{field}' is a URL: images are not fetched from {value[:4]}; send its bytes", field)
    text = value[value.index(",") + 1 :] if DATA_URI.match(value) else value
    if len(text) > limits.max_bytes * 4 // 3 + 4:
        raise RequestError(413, f"'{field}' is over {limits.max_bytes} bytes, the most an image may take", field)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(400, f"'{field}' is neither a data URI nor base64", field) from None


def request_bytes(values: list, fields: list[str], limits: ImageLimits) -> list[bytes]:
    """Every image of a request as bytes, within the request's byte budget: sent ones first, then
    the URLs side by side, each allowed an even share of what the sent ones leave."""
    if len(values) > limits.max_images:
        message = f"the request has {len(values)} images; at most {limits.max_images} (images.max_images)"
        raise RequestError(413, message, fields[0])
    urls = [index for index, value in enumerate(values) if is_url(value)]
    if len(urls) > limits.max_urls:
        message = f"the request names {len(urls)} image URLs; at most {limits.max_urls} (images.max_urls)"
        raise RequestError(413, message, fields[urls[0]])
    found = {
        index: image_bytes(value, field, limits)
        for index, (value, field) in enumerate(zip(values, fields, strict=True))
        if index not in urls
    }
    sent = sum(len(data) for data in found.values())
    if urls:
        share = min(limits.max_bytes, max(0, limits.request_bytes - sent) // len(urls))
        fetched = fetch_all([values[index] for index in urls], [fields[index] for index in urls], limits, share)
        found.update(zip(urls, fetched, strict=True))
    total = sum(len(data) for data in found.values())
    if total > limits.request_bytes:
        message = f"the request's images take {total} bytes; at most {limits.request_bytes} (images.request_bytes)"
        raise RequestError(413, message, fields[0])
    for index, data in found.items():
        if not data:
            raise RequestError(400, f"'{fields[index]}' is empty", fields[index])
    return [found[index] for index in range(len(values))]


def opened(data: bytes, field: str, limits: ImageLimits, draft_to: tuple[int, int] | None = None):
    """The image with its header read and checked, no pixel decoded; a large JPEG set to decode
    at the smallest DCT scale that still covers `draft_to` (width, height)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)  # the header only
    except UnidentifiedImageError:
        raise RequestError(
            415, f"'{field}' is not an image in a format served here ({', '.join(FORMATS)})", field
        ) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise RequestError(413, f"'{field}' has more pixels than {limits.max_pixels}", field) from None
    except (OSError, ValueError, SyntaxError) as error:  # a header that lies about itself
        raise RequestError(400, f"'{field}' is a corrupt image ({type(error).__name__})", field) from None
    _check_header(image, data, field, limits)
    if draft_to is not None and image.format == "JPEG":
        image.draft(None, draft_to)
    return image


def rgb(image, field: str):
    """The image decoded, turned upright as its EXIF orientation says, in RGB."""
    from PIL import ImageOps

    try:
        image.load()
    except (OSError, ValueError, SyntaxError, EOFError) as error:  # truncated or corrupt pixel data
        reason = f"'{field}' is a truncated or corrupt {image.format} ({type(error).__name__})"
        raise RequestError(400, reason, field) from None
    try:
        image = ImageOps.exif_transpose(image)
    except (OSError, ValueError, SyntaxError, EOFError):  # a corrupt EXIF block: the image as stored
        pass
    return image.convert("RGB")


def decode_image(value, field: str, limits: ImageLimits = ImageLimits(), draft_to=None):
    """One RGB PIL image, or a RequestError naming why not."""
    return rgb(opened(image_bytes(value, field, limits), field, limits, draft_to), field)


def read_images(values: list, fields: list[str], limits: ImageLimits, draft_to=None):
    """A request's images as RGB PIL images, one at a time (a generator: only one is decoded at
    once), after its count, bytes and every header's pixels are checked against its budget."""
    datas = request_bytes(values, fields, limits)
    images = [opened(data, field, limits, draft_to) for data, field in zip(datas, fields, strict=True)]
    pixels = sum(image.size[0] * image.size[1] for image in images)
    if pixels > limits.request_pixels:
        most = f"at most {limits.request_pixels} (images.request_pixels)"
        raise RequestError(413, f"the request's images decode to {pixels} pixels; {most}", fields[0])
    for index, field in enumerate(fields):
        image, images[index] = images[index], None
        yield rgb(image, field)


def _check_header(image, data: bytes, field: str, limits: ImageLimits) -> None:
    width, height = image.size
    if width < 1 or height < 1 or width * height > limits.max_pixels:
        most = f"at most {limits.max_pixels} pixels are decoded (images.max_pixels)"
        raise RequestError(413, f"'{field}' is {width} x {height} pixels; {most}", field)
    if max(width, height) > limits.max_aspect * min(width, height):
        most = f"one side may be at most {limits.max_aspect} times the other"
        raise RequestError(413, f"'{field}' is {width} x {height} pixels; {most}", field)
    if getattr(image, "is_animated", False):  # from the header, or one frame past the first: not every frame
        raise RequestError(400, f"'{field}' is an animated {image.format}; send one frame", field)
    if image.mode not in MODES:
        raise RequestError(
            415, f"'{field}' is in colour mode {image.mode}; send it in RGB (or grey, or with alpha)", field
        )
    # Every scan starts with an SOS marker; inside scans a 0xFF byte is stuffed (FF 00), so none is miscounted.
    scans = data.count(b"\xff\xda") if image.format == "JPEG" else 0
    if scans > limits.max_scans:
        raise RequestError(413, f"'{field}' is a JPEG of {scans} scans; at most {limits.max_scans}", field)
