"""tests/server_logs.py: a log read across log4j2's midnight rollover keeps its earlier lines first."""

import gzip
import os

from server_logs import log_text, logged_lines


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


def test_logged_lines_waits_for_the_count_then_gives_what_is_there(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "model_log.log").write_text("w1 Ready in 3s\nother\nw2 Ready in 2s\n")
    assert logged_lines(tmp_path, "Ready in", at_least=2) == ["w1 Ready in 3s", "w2 Ready in 2s"]
    assert logged_lines(tmp_path, "Ready in", at_least=3, seconds=0.2) == ["w1 Ready in 3s", "w2 Ready in 2s"]
