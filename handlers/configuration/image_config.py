"""The `images:` section of the handler's configuration (image-text-embedding): what one image,
one request's images and one worker's held images may take, and which origins' URLs are fetched.
Read by handlers/request/images.py's ImageLimits and the loops' held images (handlers/request/holding.py)."""

import dataclasses

from ts_compiled_handlers.configuration import config_values as values
from ts_compiled_handlers.configuration.config_values import option as _option


@dataclasses.dataclass(frozen=True)
class ImagesConfig:
    """image-text-embedding only."""

    fetch_from: tuple[str, ...] = _option(
        values.origins,
        (),
        shown="`[]`",
        meaning="image-text-embedding: the origins (`https://host[:port]`) whose image URLs a request may name; "
        "the worker fetches them with no redirect followed, within `fetch_seconds` and the byte limits; a name "
        "that resolves to a loopback, private, link-local or multicast address is refused unless an origin here "
        "names that address; empty: a URL is refused and images travel in the request",
        why="a worker that fetches any URL a request names can be made to reach inside its network (SSRF)",
    )
    fetch_seconds: int = _option(
        values.positive_int,
        5,
        meaning="image-text-embedding: one deadline for all of a request's image fetches, fetched side by side "
        "(name resolution, connection, headers and body: a socket still waiting then is closed); the batch waits "
        "for it",
        why="a slow or dripping origin must not hold the worker's batch for long",
    )
    max_urls: int = _option(
        values.positive_int,
        8,
        meaning="image-text-embedding: the most image URLs one request may name; one more is a 413",
        why="each URL is a connection the worker opens and waits on for the request",
    )
    max_images: int = _option(
        values.positive_int,
        64,
        meaning="image-text-embedding: the most images one request may carry; one more is a 413",
        why="each image is a vision pass; 64 is OpenAI's and Cohere's most inputs per embedding request",
    )
    max_pixels: int = _option(
        values.positive_int,
        40_000_000,
        meaning="image-text-embedding: the most pixels one image may decode to (a JPEG counted at the reduced "
        "size it is decoded at), read from its header before decoding; one more is a 413",
        why="40 megapixels holds any camera's photo; one decode holds its pixels in colour (up to 4 bytes each) "
        "and RGB (3) at once, about 280 MB at this limit",
    )
    max_scans: int = _option(
        values.positive_int,
        100,
        meaning="image-text-embedding: the most scans a progressive JPEG may have (counted from its markers before "
        "decoding); one more is a 413",
        why="each scan is a pass over every pixel: a small JPEG of thousands of scans takes seconds to decode; a "
        "camera's has 1-12, and 100 is libjpeg-turbo's own suggestion for untrusted input",
    )
    request_pixels: int = _option(
        values.positive_int,
        64_000_000,
        meaning="image-text-embedding: the most pixels all images of one request may decode to, summed from their "
        "headers before any is decoded; more is a 413",
        why="decoding costs time by the pixel: a 5 KB palette PNG of 40 megapixels takes about a second of a core, "
        "so 64 of them would hold the batch a minute; 64 megapixels is a few photos or 64 large pictures",
    )
    request_bytes: int = _option(
        values.positive_int,
        32 << 20,
        meaning="image-text-embedding: the most bytes all images of one request may take as sent or fetched "
        "(each one at most 20 MiB); each URL may fetch an even share of what the request's sent images leave",
        why="a request's images are held compressed while they are decoded one at a time",
    )
    batch_images: int = _option(
        values.positive_int,
        256,
        meaning="image-text-embedding: the most images a worker holds read and not yet answered (a TorchServe "
        "batch's, or the scheduler's queue's); a request that would pass it is a 503 (send it again), its "
        "batch-mates answered; one with more images than this alone a 413. Each is held as 8-bit pixels at "
        "the processor's size (150 KB at 224 x 224)",
        why="every held image is a vision pass of the next call: 256 bounds a batch's memory (38 MB at 224 px, "
        "110 MB at 384) and its time under TorchServe's response timeout",
    )
