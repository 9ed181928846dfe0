"""scripts/install.sh run for real, with stand-in `java`, `id`, `apt-get` and venv `python` commands."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def shim(path: Path, script: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def run_install(tmp_path: Path, java_version: str, uid: int, **env) -> subprocess.CompletedProcess:
    shims = tmp_path / "bin"
    shim(shims / "java", f"echo 'openjdk version \"{java_version}\" 2021-01-01' >&2\n")
    shim(shims / "id", f"echo {uid}\n")
    shim(shims / "apt-get", f'echo "apt-get $*" >> {tmp_path}/calls\n')
    shim(shims / "python3", f'echo "python3 $*" >> {tmp_path}/calls\nexit 3\n')  # stops before a venv
    env = {"PATH": f"{shims}:/usr/bin:/bin", "VENV": str(tmp_path / "venv"), **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "install.sh")], env=env, capture_output=True, text=True)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


@pytest.mark.heavy  # starts a process
def test_without_java_17_a_user_who_is_not_root_gets_the_command_and_nothing_is_installed(tmp_path):
    result = run_install(tmp_path, "11.0.2", uid=1000)
    assert result.returncode == 1
    assert "needs Java 17 or newer" in result.stderr
    assert "apt-get install -y -q openjdk-17-jre-headless" in result.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.heavy  # starts a process
def test_without_java_17_root_installs_it_with_apt_then_goes_on(tmp_path):
    result = run_install(tmp_path, "11.0.2", uid=0)
    assert result.returncode == 3  # the stand-in python3 stopped it after the Java step
    assert calls(tmp_path) == [
        "apt-get update -q",
        "apt-get install -y -q openjdk-17-jre-headless",
        f"python3 -m venv {tmp_path / 'venv'}",
    ]


CUDA_INDEX = "https://download.pytorch.org/whl/cu126"


@pytest.mark.heavy  # starts a process
@pytest.mark.parametrize(
    "env, torch_install",
    [
        ({}, "python -m pip install -q --no-compile torch==2.13.0"),
        (
            {"TORCH_SPEC": "torch==2.13.0+cu126", "TORCH_INDEX_URL": CUDA_INDEX},
            f"python -m pip install -q --no-compile torch==2.13.0+cu126 --index-url {CUDA_INDEX}",
        ),
    ],
)
def test_torch_comes_first_from_the_configured_spec_and_index(tmp_path, env, torch_install):
    shim(tmp_path / "venv" / "bin" / "python", f'echo "python $*" >> {tmp_path}/calls\n')
    result = run_install(tmp_path, "17.0.9", uid=1000, **env)
    assert result.returncode == 0, result.stderr
    made = calls(tmp_path)
    assert made[:2] == [torch_install, "python -m pip install -q --no-compile -e .[test]"]
    # pip's one-file-at-a-time byte-compiling skipped, then done once, on every core, after the last install
    last_install = max(index for index, call in enumerate(made) if " pip install " in call)
    assert "sysconfig" in made[last_install + 1] and "-m compileall -qq -j " in made[last_install + 2]
