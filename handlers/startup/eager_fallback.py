"""Why a worker serves eagerly: a short label for the metric (`EagerFallbacks{Reason=...}`) and
the words for the ready line. A missing or failing C++ compiler is told apart from a compile
error in the model: it is the environment's (an image without g++ or Python's headers), fixed
there, and the one cause a server can look for in its metrics."""

import dataclasses
import re

from ts_compiled_handlers.startup import warmup


@dataclasses.dataclass(frozen=True)
class Fallback:
    reason: str  # no_cxx_compiler, cxx_compile_error, check_failed, compile_error or retrace_failed
    detail: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def causes(error: BaseException):
    """`error`, then what it wraps: inductor's inner exception, the cause, the context."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__


def fallback_of(error: BaseException) -> Fallback:
    from torch._inductor import exc  # the compiler's own errors; imported once compiling has

    for cause in causes(error):
        if isinstance(cause, exc.InvalidCxxCompiler):
            return Fallback("no_cxx_compiler", str(cause))
        if isinstance(cause, exc.CppCompileError):
            first = re.search(r"(fatal )?error: .*", cause.output)  # the compiler's first error, without its path
            return Fallback("cxx_compile_error", first[0] if first else "the C++ compiler failed")
        if isinstance(cause, warmup.WarmupError):
            return Fallback("check_failed", str(cause))
    while getattr(error, "inner_exception", None) is not None:  # what dynamo and inductor wrapped
        error = error.inner_exception
    first_line = (str(error).strip().splitlines() or [""])[0]
    return Fallback("compile_error", f"{type(error).__name__}: {first_line}")
