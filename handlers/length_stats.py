"""Live traffic's token lengths and padding, so users can see when the bucket plan stops fitting.

`PaddedTokenRatio` is cumulative since ready (tokens computed / real tokens): the quantity the
bucket planner minimizes, and steady enough to alert on. The histogram of real lengths is logged
as one JSON line every `log_every` texts; `scripts/plan_buckets.py --log` reads the latest one.
Lengths are counts only: no request text is kept or logged.
"""

import collections
import json
import logging

logger = logging.getLogger(__name__)

HISTOGRAM_TAG = "LengthHistogram"


class LengthStats:
    def __init__(self, model_name: str, log_every: int = 1000):
        self.model_name = model_name
        self.log_every = log_every
        self.histogram: collections.Counter[int] = collections.Counter()
        self.real_tokens = 0
        self.padded_tokens = 0
        self._next_log = log_every

    @property
    def texts(self) -> int:
        return sum(self.histogram.values())

    @property
    def padded_ratio(self) -> float:
        return self.padded_tokens / self.real_tokens if self.real_tokens else 1.0

    def record(self, lengths: list[int], padded_tokens: int) -> None:
        """Count one batch: its texts' real token lengths and the tokens the model computed for them."""
        self.histogram.update(lengths)
        self.real_tokens += sum(lengths)
        self.padded_tokens += padded_tokens
        if self.texts >= self._next_log:
            self._next_log += self.log_every
            logger.info("%s %s", HISTOGRAM_TAG, self.log_line())

    def log_line(self) -> str:
        lengths = {str(length): count for length, count in sorted(self.histogram.items())}
        return json.dumps({"model": self.model_name, "texts": self.texts, "lengths": lengths})


def read_histograms(lines, model_name: str | None = None) -> dict[int, int]:
    """The latest histogram logged for `model_name` (or any model) in log lines; empty if none."""
    latest: dict[int, int] = {}
    for line in lines:
        _, tag, record = line.partition(HISTOGRAM_TAG + " ")
        if not tag:
            continue
        try:
            entry = json.loads(record.strip())
        except json.JSONDecodeError:
            continue  # a line cut short by log rotation
        if model_name is None or entry.get("model") == model_name:
            latest = {int(length): count for length, count in entry["lengths"].items()}
    return latest
