"""Live traffic's token lengths and padding, so users can see when the bucket plan stops fitting.

`PaddedTokenRatio` is cumulative since ready (tokens computed / real tokens): the quantity the
bucket planner minimizes, and steady enough to alert on. The histogram of real lengths is logged
as one JSON line every `log_every` texts, per worker process; `scripts/plan_buckets.py --log` adds
up the latest line of each worker. Lengths are counts only: no request text is kept or logged.
"""

import collections
import json
import logging
import os

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
            self._next_log = (self.texts // self.log_every + 1) * self.log_every
            logger.info("%s %s", HISTOGRAM_TAG, self.log_line())

    def log_line(self) -> str:
        lengths = {str(length): count for length, count in sorted(self.histogram.items())}
        record = {"model": self.model_name, "worker": os.getpid(), "texts": self.texts, "lengths": lengths}
        return json.dumps(record)


def read_histograms(lines, model_name: str | None = None) -> dict[int, int]:
    """The histogram of `model_name` (or every model) in log lines: each worker's latest, added up."""
    latest: dict[tuple, dict] = {}
    for line in lines:
        _, tag, record = line.partition(HISTOGRAM_TAG + " ")
        if not tag:
            continue
        try:
            entry = json.loads(record.strip())
        except json.JSONDecodeError:
            continue  # a line cut short by log rotation
        if model_name is None or entry.get("model") == model_name:
            latest[entry.get("model"), entry.get("worker")] = entry["lengths"]
    total: collections.Counter[int] = collections.Counter()
    for lengths in latest.values():
        total.update({int(length): count for length, count in lengths.items()})
    return dict(total)
