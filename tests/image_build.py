"""The image of tests/integration/test_image.py, built by scripts/build_image.sh when the first
test that needs it runs, or found built: the test command starts building it at once, beside the
tests, since it waits on disk and network more than on the CPU (the load-test smoke run, which it
once cost requests, is in the release check now)."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "ts-compiled-handlers:latest"


def docker_usable() -> bool:
    """Whether Docker runs here, or can be made to: as root the script installs and starts it."""
    if os.geteuid() == 0:
        return True
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


def build() -> str:
    """The image, built (or found up to date) by the script, which must succeed."""
    script = ["bash", str(ROOT / "scripts" / "build_image.sh")]
    done = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, f"scripts/build_image.sh failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    print(done.stderr.strip().splitlines()[-1])  # its size
    return IMAGE
