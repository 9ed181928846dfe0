"""Embeddings a vector store takes as they come: float32, int8, uint8, binary or ubinary.

Each precision equals sentence-transformers' `quantize_embeddings` for the same float32 rows:
binary and ubinary pack each value's sign 8 to a byte (binary as signed bytes); int8 and uint8
cut each dimension's range into 256 steps. Those ranges are the archive's own, fixed at build
(`hfserve build` embeds the calibration texts: scripts/answer_ranges.py writes RANGES_FILE), so a
text gets the same bytes from every worker, host and restart; ranges computed per request would
make codes that no two answers share. An archive built without them refuses int8 and uint8.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
RANGES_FILE = "answer_ranges.json"  # at the archive's root
STEPS = 255  # sentence-transformers' 256 buckets per dimension
# The fewest bytes JSON writes one value in (a digit and a comma); float32: the embedding's FLOAT_BYTES
INTEGER_BYTES = 2


@dataclasses.dataclass(frozen=True)
class AnswerRanges:
    """Each dimension's least and greatest value over the calibration texts' embeddings, as the
    archive serves them (`normalized`: after the model's own normalization)."""

    low: np.ndarray  # (dimensions,) float32
    high: np.ndarray
    normalized: bool
    texts: int

    @classmethod
    def of(cls, embeddings: np.ndarray, normalized: bool) -> "AnswerRanges":
        return cls(embeddings.min(axis=0), embeddings.max(axis=0), normalized, len(embeddings))

    def as_json(self) -> dict:
        return {
            "normalized": self.normalized,
            "texts": self.texts,
            "min": self.low.tolist(),
            "max": self.high.tolist(),
        }

    def write(self, folder: Path) -> None:
        (folder / RANGES_FILE).write_text(json.dumps(self.as_json()))

    def as_array(self) -> np.ndarray:
        """sentence-transformers' `ranges`: shape (2, dimensions), least then greatest."""
        return np.stack([self.low, self.high])


def read_ranges(model_dir: Path) -> AnswerRanges | None:
    """The archive's ranges, or None where it was built without them."""
    path = model_dir / RANGES_FILE
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    low, high = (np.asarray(saved[key], dtype=np.float32) for key in ("min", "max"))
    if low.shape != high.shape or low.ndim != 1:
        raise ValueError(f"{RANGES_FILE}: 'min' and 'max' must be lists of one value per dimension")
    return AnswerRanges(low, high, bool(saved["normalized"]), int(saved["texts"]))


def quantized(embeddings: np.ndarray, precision: str, ranges: AnswerRanges | None = None) -> np.ndarray:
    """`embeddings` (texts, dimensions) float32 at `precision`; int8 and uint8 need `ranges`."""
    if precision == "float32":
        return embeddings
    if precision in ("binary", "ubinary"):
        packed = np.packbits(embeddings > 0, axis=-1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if precision == "binary" else packed
    if ranges is None:
        raise ValueError(f"{precision} needs the archive's ranges")
    steps = (ranges.high - ranges.low) / STEPS
    steps = np.where(steps == 0, 1, steps)
    buckets = np.clip(np.floor((embeddings - ranges.low) / steps), 0, STEPS)
    return buckets.astype(np.uint8) if precision == "uint8" else (buckets - 128).astype(np.int8)


def values_per_text(dimensions: int, precision: str) -> int:
    """How many values one text's answer holds at `precision` (binary: 8 dimensions a byte)."""
    return -(-dimensions // 8) if precision.endswith("binary") else dimensions
