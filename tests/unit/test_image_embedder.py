"""Ray Data's ImageEmbedder reading a path column (no cluster: an actor's code, called as Ray calls
it): only regular files under the job's `image_root`, symlinks and `..` followed before the
check, opened without blocking (a FIFO with no writer), at most the image limit read; each refusal
fails the batch naming its row. The last test embeds through a tiny CLIP's real worker, a batch
of more images than a request may hold included (each row is a request of its own)."""

import io
import os
import signal
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from ts_compiled_handlers.request.images import ImageLimits
from ts_compiled_handlers.servers.ray.data import ArchiveBatches, ImageEmbedder, image_bytes

LIMIT = ImageLimits().max_bytes


def picture(seed: int = 0) -> bytes:
    pixels = (np.random.default_rng(seed).random((30, 40, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def root(tmp_path):
    """images/ with a good image; beside it, outside the folder, another good one."""
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "good.png").write_bytes(picture())
    (tmp_path / "secret.png").write_bytes(picture(1))
    return folder


def embedder(image_root, worker=None) -> ImageEmbedder:
    """An actor's ImageEmbedder over `worker` (default: one that takes a good row's bytes and
    never runs: the batch fails at the row refused)."""
    worker = worker or SimpleNamespace(
        task=SimpleNamespace(limits=ImageLimits(), read_images=lambda *_: None),
        reader=SimpleNamespace(spec=SimpleNamespace(params={}), tokenized=lambda request: None),
    )

    def built(self, archive: str, text_column: str = "text"):  # what an actor opens, built already
        self.worker, self.text_column = worker, text_column

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ArchiveBatches, "__init__", built)
        return ImageEmbedder("clip.mar", image_root=None if image_root is None else str(image_root))


@pytest.fixture
def unblocked():
    """A read that blocks (a FIFO opened for reading waits for a writer) fails the test, not hangs it."""

    def hung(*_):
        raise TimeoutError("reading the row blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def fifo(folder):
    os.mkfifo(folder / "pipe.png")
    return "pipe.png"


def over_long(folder):
    with (folder / "big.png").open("wb") as file:
        file.truncate(LIMIT + 1)  # sparse: nothing written
    return "big.png"


def link_out(folder):
    (folder / "link.png").symlink_to(folder.parent / "secret.png")
    return "link.png"


def a_folder(folder):
    (folder / "album.png").mkdir()
    return "album.png"


@pytest.mark.parametrize(
    "row, refusal",
    [
        (fifo, "pipe.png is not a regular file"),
        (lambda folder: "/dev/zero", "/dev/zero is outside"),
        (link_out, "link.png is outside"),
        (lambda folder: "../secret.png", "../secret.png is outside"),
        (lambda folder: str(folder.parent / "secret.png"), "secret.png is outside"),
        (a_folder, "album.png is not a regular file"),
        (over_long, f"big.png is over {LIMIT} bytes"),
        (lambda folder: "missing.png", "missing.png cannot be opened"),
    ],
    ids=["fifo", "dev-zero", "symlink-out", "dot-dot", "absolute-out", "directory", "over-long", "missing"],
)
def test_a_path_that_is_not_a_regular_file_under_the_folder_fails_the_batch_naming_its_row(
    root, unblocked, row, refusal
):
    paths = np.array(["good.png", row(root)], dtype=object)
    with pytest.raises(ValueError, match=r"^'image\[1\]': .*" + refusal):
        embedder(root)({"image": paths})


def test_a_device_is_refused_even_inside_the_folder_and_paths_need_a_folder(root, unblocked):
    with pytest.raises(ValueError, match=r"'image\[0\]': /dev/zero is not a regular file"):
        embedder("/dev")({"image": np.array(["zero"], dtype=object)})
    with pytest.raises(ValueError, match=r"'image\[0\]' is a path: give ImageEmbedder the folder .*image_root"):
        embedder(None)({"image": np.array(["good.png"], dtype=object)})


def test_a_regular_file_under_the_folder_is_read_whole_up_to_the_limit(root):
    (root / "inside.png").symlink_to(root / "good.png")  # a link that stays inside is followed
    for path in ("good.png", "inside.png", str(root / "good.png"), "sub/../good.png"):
        assert image_bytes(path, "image[0]", root, LIMIT) == picture()
    with (root / "full.png").open("wb") as file:
        file.truncate(LIMIT)
    assert len(image_bytes("full.png", "image[0]", root, LIMIT)) == LIMIT
    assert image_bytes(b"raw", "image[0]", None, LIMIT) == b"raw"  # a bytes column needs no folder


@pytest.mark.heavy  # builds a tiny CLIP's worker
def test_a_path_under_the_folder_embeds_as_its_bytes_do(root, tmp_path_factory):
    from fakes import ready_handler

    from ts_compiled_handlers.scripts.make_tiny_models import make

    clip_dir = make(tmp_path_factory.mktemp("tiny"), ["image-text-embedding"])["image-text-embedding"]
    grid = {"seq_lens": [8, 64], "batch_sizes": [1, 2]}
    handler = ready_handler("image-text-embedding", clip_dir, compile={"enable": False}, buckets=grid)
    actor = embedder(root, worker=handler.worker)
    by_path = actor({"image": np.array(["good.png"], dtype=object)})["embedding"]
    by_bytes = actor({"image": np.array([picture()], dtype=object)})["embedding"]
    assert by_path.shape == by_bytes.shape and np.allclose(by_path, by_bytes)
    rows = 65  # past a request's images.max_images (64): each row is a request of its own
    batch = actor(
        {"image": np.array(["good.png", picture(), *[picture(seed) for seed in range(2, rows)]], dtype=object)}
    )
    assert batch["embedding"].shape == (rows, by_path.shape[1]) and np.allclose(
        batch["embedding"][:2], by_path, atol=1e-5
    )
