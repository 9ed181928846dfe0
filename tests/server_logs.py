"""A TorchServe log as the tests read it: log4j2 rolls each file over at midnight (and at 100 MB,
handlers/servers/torchserve/log4j2.xml), so a run that crosses midnight finds its earlier lines in the rolled files."""

import gzip
import re
import time
from pathlib import Path


def log_text(workdir: Path, name: str = "model_log.log") -> str:
    """`name` under `workdir`/logs with the files rolled over from it before, oldest first."""
    logs = Path(workdir) / "logs"
    rolled = sorted(logs.glob(name.removesuffix(".log") + ".*.log.gz"), key=lambda path: path.stat().st_mtime)
    current = logs / name
    text = "".join(gzip.decompress(path.read_bytes()).decode(errors="replace") for path in rolled)
    return text + (current.read_text(errors="replace") if current.is_file() else "")


def logged_lines(workdir: Path, pattern: str, at_least: int = 1, seconds: float = 30) -> list[str]:
    """The lines of model_log.log that match `pattern`, once there are `at_least` of them (or the
    deadline passes): TorchServe marks a worker ready when its reply arrives, and the worker's last
    log lines, relayed from its stdout by another thread, may reach the file a moment later."""
    deadline = time.monotonic() + seconds
    while True:
        lines = [line for line in log_text(workdir).splitlines() if re.search(pattern, line)]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def metrics_after(server, settled, seconds: float = 10) -> str:
    """The metrics text once `settled(text)` holds, or the last one read after `seconds`: the
    frontend reads a worker's metric lines from its log stream, apart from the answers, so a
    metric may arrive a little after the answer that it counts."""
    deadline = time.monotonic() + seconds
    text = server.metrics()
    while not settled(text) and time.monotonic() < deadline:
        time.sleep(0.2)
        text = server.metrics()
    return text
