"""The image build of tests/integration/test_image.py (scripts/build_image.sh), started in the
background at collection when that test is selected: its minute or two of apt and pip (and, on
a fresh machine, of installing Docker and making the base) runs beside the tests before it."""

import os
import subprocess
import tempfile
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


class ImageBuild:
    def __init__(self):
        self.log = tempfile.TemporaryFile("w+")  # read back when the build ends
        script = ["bash", str(ROOT / "scripts" / "build_image.sh")]
        self.building = subprocess.Popen(script, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def ready(self) -> str:
        """The image, once the build has ended, which it must have done without error."""
        code = self.building.wait(timeout=1500)
        self.log.seek(0)
        output = self.log.read()
        assert code == 0, f"scripts/build_image.sh failed:\n{output[-5000:]}"
        print(output.strip().splitlines()[-1])  # its size
        return IMAGE

    def stop(self) -> None:
        self.building.kill()
        self.building.wait()
        self.log.close()
