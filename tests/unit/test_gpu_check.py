"""benchmarks/gpu_check.py, the check for the day a GPU is lent, in its dry mode: the same code path on
the CPU with a tiny model, through its main(argv), in a process where `ts` cannot be imported (as on
the lent machine, which has no TorchServe) and whose hardware is detected for the first time."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from fakes import NO_TORCHSERVE

SCRIPT = NO_TORCHSERVE + textwrap.dedent(
    """
    import sys

    from ts_compiled_handlers.benchmarks.gpu_check import main

    sys.exit(0 if main(sys.argv[1:])["passed"] else 1)
    """
)
MUST_PASS = ("auto dtype", "compile default", "parity default", "aot package", "parity aot")


@pytest.mark.heavy
def test_the_dry_run_computes_every_check_and_passes_them_and_times_every_shape(tmp_path):
    out = tmp_path / "gpu_check.json"
    command = [sys.executable, "-c", SCRIPT, "--dry", "--out", str(out)]
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the models and the AOT package in this test's own folder
    ran = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    found = json.loads(out.read_text())
    checks = {(check["check"], check["model"]): check for check in found["checks"]}
    assert found["passed"] and all(check["status"] != "failed" for check in checks.values())
    assert found["finished"] and found["running"] is None  # a run cut short would say which stage
    assert [name for name in MUST_PASS if checks[(name, "tiny")]["status"] != "passed"] == []
    assert checks[("no torchserve", None)]["status"] == "passed"
    assert checks[("compile default", "tiny")]["recompiles_after_ready"] == 0
    assert checks[("aot package", "tiny")]["model_source"] == "aot package"
    assert checks[("parity default", "tiny")]["min_cosine"] >= checks[("parity default", "tiny")]["floor"]
    tf32, reduce_overhead = checks[("tf32", None)], checks[("compile reduce-overhead", None)]
    if not torch.cuda.is_available():
        assert tf32["status"] == "not applicable" and tf32["why"] == "not applicable: no CUDA"
        assert tf32["logged"] and not tf32["tf32"]  # the hardware line was captured, and said no TF32
    assert reduce_overhead["status"] == "not applicable" and "CUDA graphs" in reduce_overhead["why"]
    shapes = [(row["batch"], row["seq_len"]) for row in found["rows"]]
    assert shapes == [(1, 8), (4, 16), (4, 32)]
    assert all(row["eager"] > 0 and row["default"] > 0 and row["aot"] > 0 for row in found["rows"])
    assert "texts/s" in ran.stdout and "PASSED" in ran.stdout
