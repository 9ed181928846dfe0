"""Deprecated: `python -m ts_compiled_handlers.runtime.allocator` prints the allocator to preload now.

Kept for one release so that entry points written for the old path still find tcmalloc. It says
nothing on stdout but the library, as before: the note goes to stderr.
"""

import os
import sys

from ts_compiled_handlers.runtime.allocator import preload

if __name__ == "__main__":
    print(
        "python -m ts_compiled_handlers.allocator is deprecated and goes in the next release: "
        "use python -m ts_compiled_handlers.runtime.allocator",
        file=sys.stderr,
    )
    print(preload(dict(os.environ)).get("LD_PRELOAD", ""))
