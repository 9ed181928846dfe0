"""The request path, module by module, as docs/design.md counts it: a trace of one call's package
functions (`sys.setprofile`, this thread) and the modules it re-enters.

A module is *left* when, after its call returns, the path enters a module not on the call stack; a
call into it after that *re-enters* it. Only the package's own modules count (TorchServe's, Ray's,
torch's and the standard library's code is not followed, nor the model's `forward`, which is the
model call), property reads and comprehensions are no calls, and a call made again from the same
place (over the texts, requests or calls of a batch) counts once.
"""

import dataclasses
import inspect
import sys
from pathlib import Path

import ts_compiled_handlers

PACKAGE = Path(ts_compiled_handlers.__file__).parent
COMPREHENSIONS = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}  # a frame each in Python 3.11
MODEL = "the model"  # on the stack while the model's forward runs: nothing under it is the path


@dataclasses.dataclass
class Trace:
    entered: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (module, function), in order
    reentries: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # each (module, function) once

    @property
    def modules(self) -> list[str]:
        """The modules in the order the path first enters them."""
        return list(dict.fromkeys(module for module, _ in self.entered))


def property_codes() -> set:
    """The code of every property getter of the package's classes imported so far (the path runs
    no other): reading one is no call."""
    codes = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith("ts_compiled_handlers.") or module is None:
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            for value in vars(cls).values():
                if isinstance(value, property) and value.fget is not None:
                    codes.add(value.fget.__code__)
    return codes


class Tracer:
    """The profile function: follows the package's frames and marks what the path leaves."""

    def __init__(self):
        self.skip, self.result = property_codes(), Trace()
        self.stack: list[str | None] = []  # per live frame: its package module, or None
        self.last_callee: dict[str | None, str] = {}  # per module: the module it entered last
        self.left: set[str] = set()
        self.seen: set[tuple] = set()  # (callee, caller, line): the call sites entered

    def module_of(self, code) -> str | None:
        path = Path(code.co_filename)
        if code in self.skip or code.co_name in COMPREHENSIONS or PACKAGE not in path.parents:
            return None
        return path.relative_to(PACKAGE).as_posix()

    def __call__(self, frame, event, arg):
        if event == "return" and self.stack:
            module = self.stack.pop()
            if module not in self.stack:  # it returned for good: what it called last is forgotten
                self.last_callee.pop(module, None)
        if event != "call":
            return
        module = None if MODEL in self.stack else self.module_of(frame.f_code)
        if module is not None and frame.f_code.co_name == "forward":
            module = MODEL
        elif module is not None and module not in self.stack:
            self.enter(frame, module)
        self.stack.append(module)

    def enter(self, frame, module: str) -> None:
        on_stack = set(self.stack)
        caller = next((entry for entry in reversed(self.stack) if entry is not None), None)
        back_to_back = self.last_callee.get(caller) == module  # the path stays in `module`
        self.last_callee[caller] = module
        if back_to_back:
            return
        site = (frame.f_code, frame.f_back and frame.f_back.f_code, frame.f_back and frame.f_back.f_lineno)
        if module in self.left and site not in self.seen:
            self.result.reentries.append((module, frame.f_code.co_name))
        self.seen.add(site)
        self.left.update(entered for entered, _ in self.result.entered if entered not in on_stack)
        self.left.discard(module)
        self.result.entered.append((module, frame.f_code.co_name))


def trace(call, *args, **kwargs) -> tuple[object, Trace]:
    """`call(*args, **kwargs)`'s result and the package modules its path entered and re-entered."""
    tracer = Tracer()
    sys.setprofile(tracer)
    try:
        value = call(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return value, tracer.result
