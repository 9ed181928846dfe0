import pytest
import torch

from ts_compiled_handlers.runtime import hardware


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


def cgroups(tmp_path, proc: str, files: dict[str, str]):
    """A fake /sys/fs/cgroup holding `files` and a /proc/self/cgroup saying `proc`."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "proc_cgroup").write_text(proc)
    return root, tmp_path / "proc_cgroup"


def v1(folder: str, quota: str, period: str) -> dict[str, str]:
    return {f"{folder}/cpu.cfs_quota_us": quota, f"{folder}/cpu.cfs_period_us": period}


@pytest.mark.parametrize(
    "proc, files, quota",
    [
        ("0::/\n", {"cpu.max": "200000 100000\n"}, 2.0),  # v2, the container's own namespace
        ("0::/pod/c1\n", {"pod/c1/cpu.max": "max 100000\n", "pod/cpu.max": "250000 100000\n"}, 2.5),  # its parent's
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # v2, no limit
        ("4:cpu,cpuacct:/c\n", v1("cpu,cpuacct/c", "150000", "100000"), 1.5),  # v1
        ("4:cpu,cpuacct:/c\n", v1("cpu,cpuacct/c", "150000", "1e5"), None),  # unreadable: no limit known
        ("3:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, no limit
        ("", {}, None),  # no cgroups at all
    ],
)  # fmt: skip
def test_the_cpu_quota_is_read_from_cgroup_v1_and_v2(tmp_path, proc, files, quota):
    root, proc_cgroup = cgroups(tmp_path, proc, files)
    assert hardware.cpu_quota(root, proc_cgroup) == quota


@pytest.mark.parametrize("limit, expected", [("50000", 1), ("150000", 1), ("250000", 2), ("6400000", 2)])
def test_usable_cores_are_the_quota_rounded_down_within_the_affinity(tmp_path, monkeypatch, limit, expected):
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: set(range(2)))  # 2 cores to run on
    root, proc_cgroup = cgroups(tmp_path, "0::/\n", {"cpu.max": f"{limit} 100000\n"})
    assert hardware.usable_cores(root, proc_cgroup) == expected
    assert hardware.cores_described(root, proc_cgroup).startswith(f"{expected} cores (container CPU quota ")


@pytest.mark.parametrize(
    ("flags", "configured", "refused", "served", "asked"),
    [
        ({"avx512_bf16"}, "auto", False, torch.bfloat16, [torch.bfloat16]),
        ({"avx512_bf16"}, "auto", True, torch.float32, [torch.bfloat16]),  # the pick drifts: float32
        (set(), "auto", True, torch.float32, []),  # float32 picked: nothing to check
        ({"avx512_bf16"}, "float16", True, torch.float16, []),  # configured: served as it is
    ],
)
def test_one_dtype_policy_serves_the_configured_dtype_or_the_pick_unless_it_drifts(
    monkeypatch, flags, configured, refused, served, asked
):
    cpu = hardware.Hardware("cpu", "cpu", None, False, frozenset(flags))
    monkeypatch.setattr(hardware, "detect", lambda: cpu)
    checked = []
    assert hardware.serving_dtype(configured, lambda picked: checked.append(picked) or refused) == served
    assert checked == asked
