"""Python source parsed into a syntax tree, safely beside other threads.

CPython 3.11's `ast.parse` keeps the depth count of its tree building in state that the process's
threads share (python/cpython#106905): a parse running in another thread at the same moment makes
it raise "SystemError: AST constructor recursion depth mismatch" for a file that is fine. CI's
pytest process, which holds the threads of the servers and models its tests started, met it in
the tests that read source (a fresh thread of its own did not help, the state being shared), so
the parse is tried again: a collision lasts as long as the other parse.
"""

import ast
import time
from ast import parse
from pathlib import Path

ATTEMPTS = 5
MISMATCH = "AST constructor recursion depth mismatch"


def parsed(path: Path) -> ast.Module:
    """The syntax tree of the Python file at `path`."""
    source = path.read_text()
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return parse(source, str(path))
        except SystemError as error:
            if MISMATCH not in str(error) or attempt == ATTEMPTS:
                raise
            time.sleep(0.05 * attempt)  # let the other thread's parse finish
    raise AssertionError("unreachable")
