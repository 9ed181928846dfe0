"""The container recipe: its entry point run for real with a stand-in `torchserve`, and the
Dockerfile's layer order (tests/integration/test_image.py builds and serves the image itself)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "docker" / "dockerd-entrypoint.sh"


def entrypoint(tmp_path: Path, *args: str) -> list[str]:
    """The folder `torchserve` runs in, then the command line the entry point hands it."""
    stand_in = tmp_path / "bin" / "torchserve"
    stand_in.parent.mkdir(exist_ok=True)
    stand_in.write_text('#!/bin/sh\npwd\nprintf "%s\\n" "$@"\n')
    stand_in.chmod(0o755)
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{stand_in.parent}:{os.environ['PATH']}", "MODEL_SERVER_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        ["bash", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, check=True, cwd=tmp_path
    )
    return done.stdout.splitlines()


OURS = "--start --ncs --ts-config HOME/config.properties --model-store HOME/model-store"


@pytest.mark.heavy  # starts a process
@pytest.mark.parametrize(
    "args, expected",
    [
        ((), f"{OURS} --foreground"),
        (("serve", "--models", "minilm=minilm.mar"), f"{OURS} --models minilm=minilm.mar --foreground"),
        (  # KServe's TorchServe runtime
            ("torchserve", "--start", "--model-store=/mnt/models/model-store"),
            "--start --model-store=/mnt/models/model-store --foreground",
        ),
        (("torchserve", "--start", "--foreground"), "--start --foreground"),
        (("--models", "m=m.mar"), f"{OURS} --models m=m.mar --foreground"),
    ],
)
def test_the_entry_point_runs_torchserve_in_the_foreground_in_its_home(tmp_path, args, expected):
    home = str(tmp_path / "home")
    assert entrypoint(tmp_path, *args) == [home, *expected.replace("HOME", home).split()]


@pytest.mark.heavy  # starts a process
def test_torchserve_without_start_runs_where_it_was_started(tmp_path):
    assert entrypoint(tmp_path, "torchserve", "--version") == [str(tmp_path), "--version"]


@pytest.mark.heavy  # starts a process
@pytest.mark.parametrize("choice", ["system", "library"])
def test_the_entry_point_starts_every_process_with_the_chosen_allocator(tmp_path, choice):
    chosen = tmp_path / "libtcmalloc_minimal.so.4"
    chosen.write_bytes(b"")  # preloaded by nothing here: the stand-in only prints what it was given
    printing = tmp_path / "bin" / "printenv-preload"
    printing.parent.mkdir()
    printing.write_text('#!/bin/sh\nprintf "%s\\n" "${LD_PRELOAD:-none}"\n')
    printing.chmod(0o755)
    python = Path(sys.executable).parent  # python3 there imports this package, as the image's does
    env = {
        **os.environ,
        "PATH": f"{printing.parent}:{python}:{os.environ['PATH']}",
        "MODEL_SERVER_HOME": str(tmp_path),
        "HFSERVE_ALLOCATOR": "system" if choice == "system" else str(chosen),
    }
    env.pop("LD_PRELOAD", None)
    done = subprocess.run(["bash", str(ENTRYPOINT), "printenv-preload"], env=env, capture_output=True, text=True)
    assert done.stdout == ("none\n" if choice == "system" else f"{chosen}\n"), done.stderr


@pytest.mark.heavy  # starts a process
def test_any_other_command_runs_as_given(tmp_path):
    env = {**os.environ, "MODEL_SERVER_HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(ENTRYPOINT), "echo", "hi"], env=env, capture_output=True, text=True)
    assert done.stdout == "hi\n"


def test_the_dockerfile_layers_go_from_what_changes_least_to_the_package_alone():
    """What the image test cannot see: no registry but the base's, the cached order of the
    layers, and no source tree in the final image."""
    recipe = (ROOT / "Dockerfile").read_text()
    steps = [line for line in recipe.splitlines() if line and not line.startswith("#")]
    assert steps[0] == "ARG BASE_IMAGE=python:3.11-slim-bookworm"
    assert [line for line in steps if line.startswith("FROM")] == ["FROM ${BASE_IMAGE} AS wheel", "FROM ${BASE_IMAGE}"]
    final = recipe[recipe.index("FROM ${BASE_IMAGE}\n") :]
    order = ["openjdk-17-jre-headless g++", '"$TORCH_SPEC"', "-r /opt/requirements.txt", "--no-deps --no-cache-dir"]
    assert [final.index(mark) for mark in order] == sorted(final.index(mark) for mark in order)
    assert "COPY . " not in recipe and "--chmod" not in recipe  # no source tree; Docker 20.10's BuildKit
    assert "USER model-server" in steps and "WORKDIR /home/model-server" in steps
    assert "VOLUME /home/model-server/model-store" in steps
    init = r"^RUN hfserve init --bind 0\.0\.0\.0 --model-store model-store --metrics-bind 127\.0\.0\.1 \."
    assert re.search(init, recipe, re.MULTILINE)  # metrics, which ask no key, on the container's loopback
    assert "EXPOSE 8080" in steps and not any(line.startswith("EXPOSE") and "8082" in line for line in steps)
    # the manifests' runAsUser and fsGroup; a home no one else reads, where TorchServe writes its key file
    assert re.search(r"groupadd --gid 1000 model-server.*useradd --uid 1000 --gid model-server ", recipe, re.DOTALL)
    assert "chmod 0700 /home/model-server" in recipe
    assert 'ENTRYPOINT ["/usr/local/bin/dockerd-entrypoint.sh"]' in steps and 'CMD ["serve"]' in steps
    assert os.access(ENTRYPOINT, os.X_OK)  # COPY keeps git's mode


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


def test_the_image_installs_the_plain_requirements_and_the_images_extra(tmp_path):
    """deploy/docker/requirements.py on a wheel's METADATA: every plain requirement, those of the
    extras named (the Dockerfile names `images`), none of the others."""
    import importlib.util
    import zipfile

    spec = importlib.util.spec_from_file_location("requirements", ROOT / "deploy" / "docker" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = ["numpy", 'ray[serve]==2.60.0; extra == "ray"', 'pillow; extra == "images"']
    lines.append("sentencepiece ; extra == 'images'")
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("x-1.0.dist-info/METADATA", "".join(f"Requires-Dist: {line}\n" for line in lines))
    assert module.requirements(str(wheel)) == ["numpy"]
    assert module.requirements(str(wheel), ("images",)) == ["numpy", "pillow", "sentencepiece"]
    assert "requirements.py /dist/*.whl images >" in (ROOT / "Dockerfile").read_text()
