"""Why a worker serves eagerly, told from the errors inductor really raises (wrapped as it wraps
them): the compiler's absence or failure apart from the model's own compile errors."""

import subprocess
import sys

import pytest
from torch._dynamo.exc import BackendCompilerFailed
from torch._inductor import exc

from ts_compiled_handlers.startup import warmup
from ts_compiled_handlers.startup.eager_fallback import Fallback, fallback_of


def wrapped(error: Exception) -> Exception:
    """`error` as torch.compile's caller sees it: inside inductor's error, raised from it."""
    try:
        try:
            raise error
        except Exception as inner:
            raise exc.InductorError(inner, None) from inner
    except Exception as outer:
        return outer


def test_a_missing_compiler_and_a_failing_one_are_told_apart_from_the_models_errors():
    output = "/tmp/x/c7.main.cpp:158:10: fatal error: Python.h: No such file or directory\ncompilation terminated.\n"
    assert fallback_of(wrapped(exc.CppCompileError(["g++", "x.cpp"], output))) == Fallback(
        "cxx_compile_error", "fatal error: Python.h: No such file or directory"
    )
    missing = fallback_of(wrapped(exc.InvalidCxxCompiler()))
    assert missing.reason == "no_cxx_compiler" and "No working C++ compiler" in missing.detail
    drift = warmup.WarmupError("compiled vs eager: outputs drift 1e-1")
    assert fallback_of(drift) == Fallback("check_failed", str(drift))
    model_error = BackendCompilerFailed(lambda: None, RuntimeError("unsupported op\nmore"), None)
    assert str(fallback_of(model_error)) == "compile_error: RuntimeError: unsupported op"


@pytest.mark.heavy  # compiles in a child process
def test_torch_compile_without_a_compiler_is_named_so(tmp_path):
    code = (
        "import torch\n"
        "from ts_compiled_handlers.startup.eager_fallback import fallback_of\n"
        "try:\n"
        "    torch.compile(lambda x: (x * 2).sin())(torch.randn(4))\n"
        "except Exception as error:\n"
        "    print(fallback_of(error).reason)\n"
    )
    env = {"CXX": str(tmp_path / "no-such-g++"), "TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "no_cxx_compiler", done.stderr[-2000:]
