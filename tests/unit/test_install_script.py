"""scripts/install.sh's Java check, run for real with stand-in `java` and `id` commands on PATH."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_install(tmp_path: Path, java_version: str, uid: int) -> subprocess.CompletedProcess:
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "java").write_text(f"#!/bin/sh\necho 'openjdk version \"{java_version}\" 2021-01-01' >&2\n")
    (shims / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {"PATH": f"{shims}:/usr/bin:/bin", "VENV": str(tmp_path / "venv")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], env=env, capture_output=True, text=True)


def test_without_java_17_a_user_who_is_not_root_gets_the_command_and_nothing_is_installed(tmp_path):
    result = run_install(tmp_path, "11.0.2", uid=1000)
    assert result.returncode == 1
    assert "needs Java 17 or newer" in result.stderr
    assert "apt-get install -y -q openjdk-17-jre-headless" in result.stderr
    assert not (tmp_path / "venv").exists()
