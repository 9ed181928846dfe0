"""The allocator a server's processes start with (handlers/runtime/allocator.py): found, chosen, reported."""

import logging
import subprocess
import sys

import pytest

from ts_compiled_handlers.runtime import allocator
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


def test_a_worker_on_glibcs_allocator_says_how_to_get_tcmalloc(caplog, monkeypatch):
    monkeypatch.setattr(allocator, "in_use", lambda: "glibc")
    with caplog.at_level(logging.INFO, logger=allocator.__name__):
        assert allocator.log_in_use() == "glibc"
    assert "LD_PRELOAD=$(python -m ts_compiled_handlers.runtime.allocator) torchserve --start" in caplog.text
