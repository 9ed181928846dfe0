"""The container recipe: its entry point run for real with a stand-in `torchserve`, and the
Dockerfile's steps, which must be the install script the tests run (no Docker daemon here)."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "docker" / "dockerd-entrypoint.sh"


def entrypoint(tmp_path: Path, *args: str) -> list[str]:
    """The command line the entry point hands to `torchserve`."""
    stand_in = tmp_path / "bin" / "torchserve"
    stand_in.parent.mkdir(exist_ok=True)
    stand_in.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{stand_in.parent}:{os.environ['PATH']}", "MODEL_SERVER_HOME": "/home/ms"}
    done = subprocess.run(["bash", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


@pytest.mark.heavy  # starts a process
@pytest.mark.parametrize(
    "args, expected",
    [
        ((), "--start --ncs --ts-config /home/ms/config.properties --model-store /home/ms/model-store --foreground"),
        (
            ("serve", "--models", "minilm=minilm.mar"),
            "--start --ncs --ts-config /home/ms/config.properties --model-store /home/ms/model-store "
            "--models minilm=minilm.mar --foreground",
        ),
        (  # KServe's TorchServe runtime
            ("torchserve", "--start", "--model-store=/mnt/models/model-store"),
            "--start --model-store=/mnt/models/model-store --foreground",
        ),
        (("torchserve", "--start", "--foreground"), "--start --foreground"),
        (("torchserve", "--version"), "--version"),
        (
            ("--models", "m=m.mar"),
            "--start --ncs --ts-config /home/ms/config.properties --model-store /home/ms/model-store "
            "--models m=m.mar --foreground",
        ),
    ],
)
def test_the_entry_point_runs_torchserve_in_the_foreground(tmp_path, args, expected):
    assert entrypoint(tmp_path, *args) == expected.split()


@pytest.mark.heavy  # starts a process
def test_any_other_command_runs_as_given(tmp_path):
    env = {**os.environ, "MODEL_SERVER_HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(ENTRYPOINT), "echo", "hi"], env=env, capture_output=True, text=True)
    assert done.stdout == "hi\n"


def test_the_dockerfile_installs_with_the_tested_script_as_a_non_root_user_on_torchserve_conventions():
    recipe = (ROOT / "Dockerfile").read_text()
    steps = [line for line in recipe.splitlines() if line and not line.startswith("#")]
    assert any("INSTALL=wheel" in line and "bash scripts/install.sh" in line for line in steps)
    assert "USER model-server" in steps and "WORKDIR /home/model-server" in steps
    assert "VOLUME /home/model-server/model-store" in steps
    assert re.search(r"^RUN hfserve init --bind 0\.0\.0\.0 --model-store model-store \.", recipe, re.MULTILINE)
    assert 'ENTRYPOINT ["/usr/local/bin/dockerd-entrypoint.sh"]' in steps and 'CMD ["serve"]' in steps
    # the user's steps come after the install, whose script the wheel test runs too
    assert recipe.index("scripts/install.sh") < recipe.index("USER model-server")
    wheel_test = (ROOT / "tests" / "wheel_install.py").read_text()  # the fixture of test_embedding_server.py
    assert '"INSTALL": "wheel"' in wheel_test and '"scripts" / "install.sh"' in wheel_test


@pytest.mark.heavy  # starts a process
def test_a_sigterm_to_the_container_stops_torchserve_through_its_own_stop(tmp_path):
    stand_in = tmp_path / "bin" / "torchserve"
    stand_in.parent.mkdir()
    stand_in.write_text(  # --start runs until killed; --stop says so and kills it
        f'#!/bin/sh\nif [ "$1" = --stop ]; then echo stopped > {tmp_path}/stop; kill $(cat {tmp_path}/pid); exit 0\n'
        "fi\n"
        f"echo $$ > {tmp_path}/pid\nexec sleep 60\n"
    )
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{stand_in.parent}:{os.environ['PATH']}", "MODEL_SERVER_HOME": str(tmp_path)}
    container = subprocess.Popen(["bash", str(ENTRYPOINT)], env=env)
    try:
        for _ in range(100):
            if (tmp_path / "pid").is_file():
                break
            time.sleep(0.1)
        container.send_signal(signal.SIGTERM)
        container.wait(timeout=20)
    finally:
        container.kill()
    assert (tmp_path / "stop").read_text() == "stopped\n"
