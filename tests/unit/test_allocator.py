"""The allocator a server's processes start with (handlers/runtime/allocator.py): found, chosen, reported."""

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ts_compiled_handlers.runtime import allocator, package_files
from ts_compiled_handlers.scripts.serve import TorchServe


def library(folder, name):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"")
    return folder / name


def test_the_minimal_tcmalloc_is_found_before_the_full_one_whichever_folder_holds_it(tmp_path):
    full = library(tmp_path / "a", "libtcmalloc.so.4")
    minimal = library(tmp_path / "b", "libtcmalloc_minimal.so.4")
    assert allocator.find([tmp_path / "a", tmp_path / "b"]) == minimal
    minimal.unlink()
    assert allocator.find([tmp_path / "a", tmp_path / "b"]) == full
    assert allocator.find([tmp_path / "none"]) is None


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "FOUND"),
        ({"HFSERVE_ALLOCATOR": "auto"}, "FOUND"),
        ({"HFSERVE_ALLOCATOR": "system"}, None),
        ({"LD_PRELOAD": "/opt/mine.so"}, None),  # the user's own preload is kept as it is
        ({"HFSERVE_ALLOCATOR": "CHOSEN"}, "CHOSEN"),
    ],
)
def test_preload_follows_the_setting_and_keeps_a_users_own(tmp_path, env, expected):
    found = library(tmp_path / "lib", "libtcmalloc_minimal.so.4")
    chosen = library(tmp_path / "other", "libjemalloc.so.2")
    names = {"FOUND": str(found), "CHOSEN": str(chosen)}
    env = {key: names.get(value, value) for key, value in env.items()}
    got = allocator.preload(env, [tmp_path / "lib"])
    assert got == ({"LD_PRELOAD": names[expected]} if expected else {})


def test_nothing_is_preloaded_where_no_tcmalloc_is_installed(tmp_path):
    assert allocator.preload({}, [tmp_path]) == {}


def test_a_chosen_library_that_is_missing_is_said_and_glibcs_kept(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=allocator.__name__):
        assert allocator.preload({"HFSERVE_ALLOCATOR": str(tmp_path / "missing.so")}, [tmp_path]) == {}
    assert "is not a file" in caplog.text


@pytest.mark.parametrize(
    "mapped, expected",
    [
        ("7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n", "tcmalloc"),
        ("7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n", "jemalloc"),
        ("7f00-7f10 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n", "glibc"),
    ],
)
def test_the_allocator_in_use_is_read_from_the_mapped_libraries(tmp_path, mapped, expected):
    (tmp_path / "maps").write_text(mapped)
    assert allocator.in_use(tmp_path / "maps") == expected
    assert allocator.in_use(tmp_path / "absent") == "unknown"


def test_a_worker_on_glibc_says_how_to_get_tcmalloc(monkeypatch, caplog):
    monkeypatch.setattr(allocator, "in_use", lambda: "glibc")
    with caplog.at_level(logging.INFO, logger=allocator.__name__):
        assert allocator.log_in_use() == "glibc"
    assert "libtcmalloc-minimal4" in caplog.text and "LD_PRELOAD" in caplog.text


def test_torchserve_started_by_us_gets_the_preload_in_its_environment(tmp_path, monkeypatch):
    found = library(tmp_path / "lib", "libtcmalloc_minimal.so.4")
    monkeypatch.setattr(allocator, "find", lambda dirs=None: found)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("HFSERVE_ALLOCATOR", raising=False)
    assert TorchServe(tmp_path / "w", tmp_path / "store").env["LD_PRELOAD"] == str(found)
    kept = TorchServe(tmp_path / "w", tmp_path / "store", env={"HFSERVE_ALLOCATOR": "system"})
    assert "LD_PRELOAD" not in kept.env


@pytest.mark.heavy  # starts a process
def test_the_module_prints_the_library_for_the_images_entry_point(tmp_path):
    env = {"HFSERVE_ALLOCATOR": "system", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", allocator.__name__], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "\n"
    chosen = library(tmp_path, "libtcmalloc_minimal.so.4")
    env["HFSERVE_ALLOCATOR"] = str(chosen)
    done = subprocess.run([sys.executable, "-m", allocator.__name__], env=env, capture_output=True, text=True)
    assert done.stdout == f"{chosen}\n"


WORKER_COMMAND = ["python", "/srv/ts/model_service_worker.py", "--sock-type", "unix", "--sock-name", "/tmp/.ts.sock"]


def test_a_worker_nobody_gave_an_allocator_execs_its_own_command_again_under_the_chosen_one(tmp_path):
    chosen = library(tmp_path, "libtcmalloc_minimal.so.4")
    execs = []
    env = {"PATH": "/usr/bin", "HFSERVE_ALLOCATOR": str(chosen)}
    allocator.restart_worker(WORKER_COMMAND, env, execve=lambda *call: execs.append(call))
    assert execs == [(sys.executable, WORKER_COMMAND, {**env, "LD_PRELOAD": str(chosen)})]
    for env in ({"LD_PRELOAD": "/opt/mine.so"}, {"HFSERVE_ALLOCATOR": "system"}):  # chosen already, or refused
        allocator.restart_worker(WORKER_COMMAND, env, execve=lambda *call: execs.append(call))
    assert len(execs) == 1


def test_a_worker_whose_exec_fails_goes_on_and_says_why(tmp_path, capsys):
    def refuse(*call):
        raise PermissionError("exec refused")

    allocator.restart_worker(WORKER_COMMAND, {"HFSERVE_ALLOCATOR": str(library(tmp_path, "lib.so"))}, execve=refuse)
    assert "stays on glibc's, exec failed: exec refused" in capsys.readouterr().err


def a_library_to_preload() -> Path:
    """tcmalloc where it is installed; else the C library, mapped anyway, so preloading it changes nothing."""
    maps = Path("/proc/self/maps").read_text().split()
    return allocator.find() or Path(next(path for path in maps if Path(path).name.startswith("libc.so")))


@pytest.mark.heavy  # starts processes
def test_the_archives_sitecustomize_restarts_a_torchserve_worker_in_place_and_runs_the_one_it_hides(tmp_path):
    """As TorchServe starts a worker: the archive's folder first on PYTHONPATH, the worker script
    `.../ts/model_service_worker.py`; the interpreter's own sitecustomize after it on the path."""
    archive, hidden, ts = tmp_path / "archive", tmp_path / "site", tmp_path / "ts"
    for folder in (archive, hidden, ts):
        folder.mkdir()
    shutil.copy(package_files.PACKAGE / "archive_sitecustomize.py", archive / "sitecustomize.py")
    (hidden / "sitecustomize.py").write_text("print('the hidden sitecustomize ran')\n")
    report = (
        "import json, os, sys\n"
        "mapped = os.environ['MAPPED'] in open('/proc/self/maps').read()\n"
        "print(json.dumps([os.getpid(), os.environ.get('LD_PRELOAD'), sys.argv[1:], mapped]))\n"
    )
    (ts / "model_service_worker.py").write_text(report)
    (tmp_path / "other.py").write_text(report)
    chosen = a_library_to_preload()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{archive}:{hidden}", "HFSERVE_ALLOCATOR": str(chosen)}
    env["MAPPED"] = str(chosen.resolve())
    for script, restarted in ((ts / "model_service_worker.py", True), (tmp_path / "other.py", False)):
        command = [sys.executable, str(script), "--port", "9000"]
        worker = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        printed = worker.communicate(timeout=120)[0].splitlines()
        assert worker.returncode == 0 and printed[0] == "the hidden sitecustomize ran" and len(printed) == 2
        pid, preload, arguments, mapped = json.loads(printed[1])
        assert pid == worker.pid and arguments == ["--port", "9000"]  # the same process, its command kept
        assert preload == (str(chosen) if restarted else None)
        assert mapped or not restarted
