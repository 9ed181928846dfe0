"""The process-wide torch settings, each made by the function named for it (what needs no GPU)."""

import os
from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.fx.experimental._config as fx_config

from ts_compiled_handlers.runtime import hardware, process_settings


@pytest.mark.parametrize(
    "cores, workers, threads, expected", [(2, 1, None, 2), (8, 3, None, 2), (2, 4, None, 1), (8, 1, 3, 3)]
)
def test_threads_share_the_cores_between_workers(monkeypatch, cores, workers, threads, expected):
    set_threads = []
    monkeypatch.setattr(hardware, "usable_cores", lambda: cores)
    monkeypatch.setattr(torch, "set_num_threads", set_threads.append)
    settings = process_settings.share_cores(threads, workers, None)
    assert settings.threads == expected and set_threads == [expected]


@pytest.fixture
def compiler_settings_restored():
    """Start from the opposite of what a worker sets; the session's values come back afterwards."""
    inductor = {"fx_graph_cache": False, "cpp_cache_precompile_headers": True, "cpp.dynamic_threads": False}
    with (
        inductor_config.patch(inductor),
        fx_config.patch(backed_size_oblivious=False),
        torch._dynamo.config.patch(recompile_limit=8),
    ):
        yield


@pytest.mark.usefixtures("compiler_settings_restored")
def test_compiler_settings_are_made_where_a_worker_compiles(monkeypatch):
    monkeypatch.setenv(process_settings.PRECOMPILED_HEADERS_ENV, "1")  # asked for: on (the tests' run asks)
    process_settings.configure_compiler("all", graphs_needed=20)
    assert inductor_config.cpp_cache_precompile_headers is True
    monkeypatch.delenv(process_settings.PRECOMPILED_HEADERS_ENV)
    process_settings.configure_compiler("all", graphs_needed=20)
    assert inductor_config.fx_graph_cache is True and inductor_config.cpp_cache_precompile_headers is False
    assert process_settings.kernels_follow_thread_count() and inductor_config.cpp.dynamic_threads is True
    assert fx_config.backed_size_oblivious is True
    assert torch._dynamo.config.recompile_limit == 20
    with process_settings.thread_count_baked_in():
        assert not process_settings.kernels_follow_thread_count()
    assert process_settings.kernels_follow_thread_count()


@pytest.mark.usefixtures("compiler_settings_restored")
def test_static_shapes_stay_specialized_and_the_recompile_limit_only_grows():
    fx_config.backed_size_oblivious = True
    process_settings.configure_compiler("none", graphs_needed=2)
    assert fx_config.backed_size_oblivious is False and torch._dynamo.config.recompile_limit == 8
    process_settings.allow_graphs(12)
    assert torch._dynamo.config.recompile_limit == 12


def test_the_inductor_cache_directory_is_set_through_the_environment(tmp_path):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    previous = os.environ.get(process_settings.INDUCTOR_CACHE_ENV)
    try:
        process_settings.use_inductor_cache(tmp_path)
        assert os.environ[process_settings.INDUCTOR_CACHE_ENV] == cache_dir() == str(tmp_path)
    finally:
        if previous is None:
            os.environ.pop(process_settings.INDUCTOR_CACHE_ENV)
        else:
            process_settings.use_inductor_cache(Path(previous))
