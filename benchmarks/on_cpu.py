"""Where a process's CPU goes, by perf's samples of its threads while they run: in the model or not.

py-spy counts a thread as busy while it is runnable, also while it waits for a core: on 2 shared
cores the worker's `sendall` wakes the frontend, which takes the core, and py-spy goes on sampling
the worker inside `sendall`. perf's `cpu-clock` event ticks only while a thread runs, and perf
unwinds each sample's native stack (DWARF), which says where the thread was: in the compiled model
(under torch's eval-frame hook, or in torch's native code where unwinding stops before the
interpreter: oneDNN's JIT-ed kernels and MKL's have no unwind tables), in torch called from Python
outside it (tensors made from numpy arrays, pooling), or elsewhere: the Rust tokenizer, numpy,
orjson, the kernel (system calls), the interpreter running ours and TorchServe's Python.
"""

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

TORCH_NATIVE = re.compile(r"libtorch|libc10|libgomp|libiomp|libmkl|libdnnl|libsleef|torchinductor|/perf-\d+\.map")
COMPILED_REGION = "dynamo__custom_eval_frame"  # torch.compile's frame hook, the compiled model's entry
INTERPRETER = re.compile(r"libpython|/bin/python")
MODEL = "model"
TORCH_OUTSIDE = "torch outside the model"
NATIVE = {"tokenizers": "tokenizer (Rust)", "numpy": "numpy", "orjson": "orjson", "[kernel.kallsyms]": "kernel"}
PYTHON = "interpreter and libc"
KINDS = (MODEL, TORCH_OUTSIDE, *NATIVE.values(), PYTHON)
PERIOD_NS = 4_000_000  # one sample per 4 ms a thread runs (250 Hz of CPU)


def kind_of(frames: list[str]) -> str:
    """Where one sample was (frames leaf first, as `perf script` writes them: `address symbol (dso)`)."""
    if any(TORCH_NATIVE.search(frame) for frame in frames):
        compiled = any(COMPILED_REGION in frame for frame in frames)
        return MODEL if compiled or not any(INTERPRETER.search(frame) for frame in frames) else TORCH_OUTSIDE
    for mark, kind in NATIVE.items():
        if any(mark in frame for frame in frames):
            return kind
    return PYTHON


def read_samples(script: str) -> Counter:
    """Samples per kind from `perf script -F tid,ip,sym,dso` (a sample: its thread's line, then one
    indented line per frame, then a blank line)."""
    found = Counter()
    frames = None
    for line in [*script.splitlines(), ""]:
        if not line.strip():
            if frames is not None:
                found[kind_of(frames)] += 1
            frames = None
        elif line[0].isspace() and frames is not None:
            frames.append(line.strip())
        else:
            frames = []
    return found


def available() -> bool:
    """Whether perf is installed and may record here (root, or perf_event_paranoid low enough)."""
    if shutil.which("perf") is None:
        return False
    return subprocess.run(["perf", "stat", "-e", "cpu-clock", "true"], capture_output=True).returncode == 0


def record(pid: int, seconds: float, data: Path) -> subprocess.Popen:
    """Start sampling every thread of `pid` for `seconds`, each sample's stack copied for unwinding."""
    command = ["record", "-e", "cpu-clock", "-c", str(PERIOD_NS), "--call-graph", "dwarf,16384"]
    command += ["-p", str(pid), "-o", str(data), "--", "sleep", str(seconds)]
    return subprocess.Popen(["perf", *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def samples_of(recording: subprocess.Popen, data: Path) -> Counter:
    """The samples per kind of a finished `record` (its data file is deleted: ~10 MB a second)."""
    recording.wait(timeout=120)
    script = subprocess.run(
        ["perf", "script", "--no-inline", "-F", "tid,ip,sym,dso", "-i", str(data)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data.unlink(missing_ok=True)
    return read_samples(script)


def ms_per_item(samples: Counter, cpu_seconds: float, items: int) -> dict[str, float]:
    """Each kind's CPU ms per item: the process's CPU (read from /proc) shared out as its samples are."""
    total = sum(samples.values())
    if not total or not items:
        return {}
    return {kind: 1000 * cpu_seconds * samples[kind] / total / items for kind in KINDS}
