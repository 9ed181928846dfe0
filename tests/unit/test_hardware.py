import pytest
import torch

from handlers import hardware


@pytest.fixture
def fresh_detect(monkeypatch):
    """detect() with its cache cleared, TF32 calls recorded instead of applied."""
    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    hardware.detect.cache_clear()
    yield calls
    hardware.detect.cache_clear()


def fake_cuda(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)


def test_ampere_turns_tf32_on_and_picks_bfloat16(monkeypatch, fresh_detect, caplog):
    fake_cuda(monkeypatch, (8, 0))
    with caplog.at_level("INFO"):
        found = hardware.detect()
    assert fresh_detect == ["high"]
    assert found.tf32 and found.device == "cuda" and found.cuda_capability == (8, 0)
    assert found.auto_dtype == torch.bfloat16
    assert "Fake GPU" in caplog.text and "(8, 0)" in caplog.text


def test_older_cuda_keeps_fp32_matmuls_and_picks_float16(monkeypatch, fresh_detect):
    fake_cuda(monkeypatch, (7, 5))
    found = hardware.detect()
    assert fresh_detect == []
    assert not found.tf32
    assert found.auto_dtype == torch.float16


def test_cpu_without_cuda_reads_matrix_flags(monkeypatch, fresh_detect):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "read_cpu_flags", lambda: frozenset({"amx_bf16", "amx_tile"}))
    found = hardware.detect()
    assert fresh_detect == []
    assert found.device == "cpu" and found.auto_dtype == torch.bfloat16


def test_detect_runs_once_per_process(monkeypatch, fresh_detect):
    fake_cuda(monkeypatch, (9, 0))
    assert hardware.detect() is hardware.detect()
    assert fresh_detect == ["high"]


@pytest.mark.parametrize(
    "flags, native",
    [("fpu avx512f amx_bf16 amx_tile", True), ("fpu avx512f avx512_bf16", True), ("fpu avx2", False)],
)
def test_cpu_flags_from_cpuinfo(tmp_path, flags, native):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    found = hardware.Hardware("cpu", "cpu", None, False, hardware.read_cpu_flags(cpuinfo))
    assert found.native_bf16 is native
    assert found.auto_dtype == (torch.bfloat16 if native else torch.float32)
    assert hardware.read_cpu_flags(tmp_path / "missing") == frozenset()
