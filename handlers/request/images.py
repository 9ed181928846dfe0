"""Images from a request, decoded under limits set before any pixel is decoded.

An image comes as a data URI (`data:image/png;base64,...`), as bare base64, or as raw bytes (a
binary body). Its bytes are counted before they are decoded from base64; Pillow then reads only
the header, and the format, the frame count, the colour mode and the width x height are checked
before the pixels are decoded, so a few-KB PNG that claims 20,000 x 20,000 pixels is refused
without its 1.2 GB being allocated. A URL is fetched only from an origin the archive's config
names (handlers/request/image_urls.py); by default none, and an image must travel in the request.
Every refusal is a RequestError naming the reason, for that image's request alone.
"""

import base64
import binascii
import dataclasses
import io
import re
import warnings

from ts_compiled_handlers.request.image_urls import fetch_image
from ts_compiled_handlers.request.payload import RequestError

# Formats a browser or camera sends; TIFF, ICO, PSD and the rest are refused by name.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP")
# Colour modes converted to RGB as the model's processor would; CMYK (print JPEGs) and others are
# refused: their conversion to RGB depends on a colour profile the request does not carry.
MODES = ("RGB", "RGBA", "L", "LA", "P", "I;16", "I")
DATA_URI = re.compile(r"data:image/[a-z0-9.+-]+;base64,", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class ImageLimits:
    """The most bytes an image may take (as sent, before base64 is decoded: 4/3 of them), the
    most pixels it may decode to, and how many times longer than wide (or wide than high) it may be.
    40 megapixels holds any camera's photo; the model sees 224 x 224. A processor that scales the
    shorter side to 224 would make a 40,000,000 x 1 strip (a 155 KB PNG) gigabytes of pixels."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    max_aspect: int = 100
    fetch_from: tuple[str, ...] = ()  # origins whose URLs are fetched (`images.fetch_from`)
    fetch_seconds: int = 5


def image_bytes(value, field: str, limits: ImageLimits) -> bytes:
    """The image's bytes, from a data URI, bare base64, raw bytes or an allowed origin's URL."""
    if isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    elif isinstance(value, str) and value[:8].lower().startswith(("http://", "https://")):
        data = fetch_image(value, field, limits.fetch_from, limits.fetch_seconds, limits.max_bytes)
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


def decode_image(value, field: str, limits: ImageLimits = ImageLimits()):
    """One RGB PIL image, or a RequestError naming why not."""
    from PIL import Image, UnidentifiedImageError

    data = image_bytes(value, field, limits)
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
    _check_header(image, field, limits)
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, EOFError) as error:  # truncated or corrupt pixel data
        reason = f"'{field}' is a truncated or corrupt {image.format} ({type(error).__name__})"
        raise RequestError(400, reason, field) from None
    return image.convert("RGB")


def _check_header(image, field: str, limits: ImageLimits) -> None:
    width, height = image.size
    if width < 1 or height < 1 or width * height > limits.max_pixels:
        raise RequestError(
            413, f"'{field}' is {width} x {height} pixels; at most {limits.max_pixels} pixels are decoded", field
        )
    if max(width, height) > limits.max_aspect * min(width, height):
        most = f"one side may be at most {limits.max_aspect} times the other"
        raise RequestError(413, f"'{field}' is {width} x {height} pixels; {most}", field)
    if getattr(image, "n_frames", 1) > 1:
        raise RequestError(
            400, f"'{field}' is an animated {image.format} ({image.n_frames} frames); send one frame", field
        )
    if image.mode not in MODES:
        raise RequestError(
            415, f"'{field}' is in colour mode {image.mode}; send it in RGB (or grey, or with alpha)", field
        )
