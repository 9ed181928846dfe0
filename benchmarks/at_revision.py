"""An archive built by another git revision's code: the "before" of a before-and-after measurement.

The revision's package (its handlers/, scripts/ and benchmarks/, laid out as setup.py lays them
out) is taken with `git archive`, and that revision's own build runs in a fresh Python whose path
puts the package first (the installed package's editable finder comes after the path). So the
archive carries the revision's serving code and its build's defaults, and a worker runs that code:
TorchServe puts the archive's folder on the worker's path ahead of site-packages.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ts_compiled_handlers.runtime import package_files

REPOSITORY = Path(__file__).resolve().parent.parent
LAYOUT = {"handlers": "", "scripts": "scripts", "benchmarks": "benchmarks"}  # repository folder: package folder
BUILD = (
    "import json, sys; from pathlib import Path; from ts_compiled_handlers.scripts import build_mar; "
    "print(build_mar.build(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]), json.loads(sys.argv[5])))"
)


def short(revision: str) -> str:
    """The revision's abbreviated commit (raises if the repository does not have it)."""
    found = subprocess.run(
        ["git", "-C", str(REPOSITORY), "rev-parse", "--short", f"{revision}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if found.returncode:
        raise ValueError(f"no commit {revision!r} in {REPOSITORY}: {found.stderr.strip()}")
    return found.stdout.strip()


def build_at(revision: str, model_dir: Path, task: str, name: str, store: Path, config: dict) -> Path:
    """The .mar of `model_dir` as `revision`'s build makes it, written to `store`."""
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        tree = subprocess.run(
            ["git", "-C", str(REPOSITORY), "archive", "--format=tar", revision, *LAYOUT],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(temp)], input=tree.stdout, check=True)
        package = temp / "path" / package_files.NAME
        for folder, inside in LAYOUT.items():
            shutil.copytree(temp / folder, package / inside, dirs_exist_ok=True)
        arguments = [str(model_dir), task, name, str(store), json.dumps(config)]
        built = subprocess.run(
            [sys.executable, "-c", BUILD, *arguments],
            env={**os.environ, "PYTHONPATH": str(temp / "path")},
            cwd=temp,
            capture_output=True,
            text=True,
        )
    if built.returncode:
        raise RuntimeError(f"the build at {revision} failed:\n{built.stderr[-3000:]}")
    return Path(built.stdout.strip().splitlines()[-1])
