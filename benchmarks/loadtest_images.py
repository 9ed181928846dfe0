"""The load test's image mix (issue 59): a CLIP archive of ours against TorchServe's stock way of
serving one, on the same bodies.

One request in four is a JPEG as the binary body (`Content-Type: image/jpeg`, TorchServe's own
image convention), the others the text of the stream as text/plain; which, and which of eight
seeded pictures (320 x 240), follows from the text, so every contender meets the same traffic.

- `ours-images`: our `image-text-embedding` archive, `dtype: auto`;
- `stock-images`: benchmarks/stock_image_handler.py, float32 with TorchServe's pt2 compile, as
  `stock` is for texts.

The model is a random-weight CLIP of ViT-B/32's shape (scripts/make_tiny_models.py, `b32`), or
the tests' tiny one with `--quick`. The run compares each one's answers for a probe image and text
with the other's.
"""

import io
import zlib
from functools import cache
from pathlib import Path

import numpy as np

IMAGE_CONTENDERS = ("ours-images", "stock-images")
IMAGE_EVERY = 4  # one request in this many carries an image


def model_folder(scratch: Path, quick: bool) -> Path:
    from ts_compiled_handlers.scripts.make_tiny_models import make_clip

    folder = scratch / "clip"
    if not (folder / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        make_clip(folder, "test" if quick else "b32")
    return folder


@cache
def pictures(count: int = 8) -> tuple[bytes, ...]:
    """Seeded 320 x 240 JPEGs: a gradient under noise, the size a photo thumbnail has."""
    from PIL import Image

    made = []
    for seed in range(count):
        rng = np.random.default_rng(seed)
        gradient = np.linspace(0, 255, 320)[None, :, None] * rng.random(3)
        pixels = np.clip(gradient + rng.normal(0, 40, (240, 320, 3)), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(out, "JPEG", quality=85)
        made.append(out.getvalue())
    return tuple(made)


def body(text: str) -> tuple[bytes, str]:
    """The request the stream's `text` makes: a picture as the body, or the text itself."""
    digest = zlib.crc32(text.encode())
    if digest % IMAGE_EVERY == 0:
        return pictures()[digest // IMAGE_EVERY % len(pictures())], "image/jpeg"
    return text.encode(), "text/plain; charset=utf-8"


STOCK_HANDLER = Path(__file__).parent / "stock_image_handler.py"


def probe_answers(server, name: str, text: str) -> list[list[float]]:
    """The contender's vectors for the first picture and for `text`."""
    image = server.predict(name, pictures()[0], content_type="image/jpeg").json()
    words = server.predict(name, text, content_type="text/plain").json()
    return [image["embedding"], words["embedding"]]
