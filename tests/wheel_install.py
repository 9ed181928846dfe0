"""A fresh venv with the package installed from a wheel of this checkout (scripts/install.sh with
INSTALL=wheel, as a user installs), and its commands. The install starts in the background
when a test that needs it is collected (tests/integration/conftest.py), so its minute of pip runs
beside the tests before it rather than in front of its own."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class WheelInstall:
    def __init__(self, root: Path):
        self.root, self.venv, self.dist = root, root / "venv", root / "dist"
        env = {**os.environ, "INSTALL": "wheel", "VENV": str(self.venv), "DIST": str(self.dist)}
        env["COMPILE_JOBS"] = "1"  # beside the servers' tests: one core, as pip's own compiling took
        self.log = open(root / "install.log", "w+")  # read back when the install ends
        script = ["bash", str(ROOT / "scripts" / "install.sh")]
        self.installing = subprocess.Popen(script, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def env(self) -> dict:
        """The environment of a command from the new venv, read when it runs: the run's shared
        inductor cache is set after collection, when this install already started, and a copy made
        then sent the wheel's server to compile MiniLM cold, twice."""
        env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.venv / 'bin'}:{env['PATH']}"
        return env

    def ready(self) -> "WheelInstall":
        """Once the install has ended, which it must have done without error."""
        code = self.installing.wait(timeout=900)
        self.log.seek(0)
        assert code == 0, f"INSTALL=wheel scripts/install.sh failed:\n{self.log.read()[-3000:]}"
        return self

    @property
    def site_packages(self) -> Path:
        return Path(self.python("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())

    def python(self, *args: str, cwd: Path | None = None) -> str:
        return self.run(str(self.venv / "bin" / "python"), *args, cwd=cwd)

    def hfserve(self, *args: str, cwd: Path) -> str:
        return self.run("hfserve", *args, cwd=cwd)

    def run(self, *command: str, cwd: Path | None = None) -> str:
        # Files, not pipes: `hfserve start` leaves TorchServe running, which holds what it inherits.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            done = subprocess.run(command, cwd=cwd, env=self.env, stdout=out, stderr=err, text=True, timeout=900)
            out.seek(0), err.seek(0)
            assert done.returncode == 0, f"{command}: {err.read()[-3000:]}"
            return out.read()

    def files(self) -> set[str]:
        """Everything in site-packages but bytecode caches (an import may write those)."""
        paths = self.site_packages.rglob("*")
        return {str(path) for path in paths if "__pycache__" not in path.parts and not path.is_dir()}

    def remove(self) -> None:
        self.installing.kill()
        self.installing.wait()
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def start(prefix: str = "wheel_install") -> WheelInstall:
    return WheelInstall(Path(tempfile.mkdtemp(prefix=prefix)))
