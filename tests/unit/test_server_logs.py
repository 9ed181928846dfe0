"""tests/server_logs.py: a log read across log4j2's midnight rollover keeps its earlier lines first."""

import gzip
import os

from server_logs import log_text


def test_rolled_files_come_first_oldest_first_then_the_current_one(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for day, (text, mtime) in {"26-Nov": ("first\n", 100), "27-Nov": ("second\n", 200)}.items():
        rolled = logs / f"model_log.{day}.log.gz"
        rolled.write_bytes(gzip.compress(text.encode()))
        os.utime(rolled, (mtime, mtime))
    (logs / "ts_log.27-Nov.log.gz").write_bytes(gzip.compress(b"another file\n"))
    (logs / "model_log.log").write_text("third\n")
    assert log_text(tmp_path) == "first\nsecond\nthird\n"
    assert log_text(tmp_path, "ts_log.log") == "another file\n"
