"""A TorchServe log as the tests read it: log4j2 rolls each file over at midnight (and at 100 MB,
handlers/log4j2.xml), so a run that crosses midnight finds its earlier lines in the rolled files."""

import gzip
from pathlib import Path


def log_text(workdir: Path, name: str = "model_log.log") -> str:
    """`name` under `workdir`/logs with the files rolled over from it before, oldest first."""
    logs = Path(workdir) / "logs"
    rolled = sorted(logs.glob(name.removesuffix(".log") + ".*.log.gz"), key=lambda path: path.stat().st_mtime)
    current = logs / name
    text = "".join(gzip.decompress(path.read_bytes()).decode(errors="replace") for path in rolled)
    return text + (current.read_text(errors="replace") if current.is_file() else "")
