"""The memory allocator a server's processes run with: tcmalloc where it is installed, else glibc's.

On a CPU the serving path's small allocations are a large share of what is not the model: glibc's
malloc and free were ~30% of the Rust tokenizer's time, and with tcmalloc the worker spent 0.93-0.97x
the CPU outside the model (docs/performance.md, "The memory allocator"). An allocator is chosen
when a process starts (`LD_PRELOAD`), never after, and only by whoever starts it: the commands that
start TorchServe (`hfserve serve` / `start`, the benchmarks, the image's entry point) set it for the
frontend, whose workers inherit it; plain `torchserve --start` gets it from
`LD_PRELOAD=$(python -m ts_compiled_handlers.runtime.allocator)` before it. A worker says which one
it got, and how to get tcmalloc where it got glibc's. `HFSERVE_ALLOCATOR` picks: unset or `auto`
(tcmalloc if found), `system` (glibc's), or a library's path. A user's own `LD_PRELOAD` is kept.
"""

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

SETTING = "HFSERVE_ALLOCATOR"
# Debian and Ubuntu's libtcmalloc-minimal4 first (the allocator alone), then gperftools' full library.
LIBRARY_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
KNOWN = ("tcmalloc", "jemalloc", "mimalloc")


def find(dirs=LIBRARY_DIRS) -> Path | None:
    """The first tcmalloc library installed in `dirs`, or None."""
    for name in LIBRARY_NAMES:
        for folder in dirs:
            if (Path(folder) / name).is_file():
                return Path(folder) / name
    return None


def preload(env: dict, dirs=LIBRARY_DIRS) -> dict:
    """What to add to `env` (a server's environment) so its processes start with the chosen allocator:
    `{"LD_PRELOAD": path}`, or nothing (the user's own LD_PRELOAD, `system`, none installed). A path
    that is not a file is the user's mistake: said, and glibc's kept."""
    choice = env.get(SETTING, "auto")
    if env.get("LD_PRELOAD") or choice == "system":
        return {}
    if choice == "auto":
        library = find(dirs)
        return {"LD_PRELOAD": str(library)} if library else {}
    if not Path(choice).is_file():
        logger.warning("%s=%s is not a file: the processes keep glibc's allocator", SETTING, choice)
        return {}
    return {"LD_PRELOAD": choice}


def in_use(maps: Path = Path("/proc/self/maps")) -> str:
    """The allocator this process runs with: a known one mapped in, else `glibc` (`unknown` off Linux)."""
    try:
        text = maps.read_text()
    except OSError:
        return "unknown"
    return next((name for name in KNOWN if f"lib{name}" in text), "glibc")


def log_in_use() -> str:
    """Say which allocator the worker got, and how to get tcmalloc where it runs on glibc's."""
    name = in_use()
    if name == "glibc":
        logger.info(
            "Memory allocator: glibc's. tcmalloc cuts the serving path's CPU: install libtcmalloc-minimal4, then "
            "start TorchServe with `LD_PRELOAD=$(python -m ts_compiled_handlers.runtime.allocator) torchserve "
            "--start ...` or with `hfserve serve` / `hfserve start` (docs/operations.md#memory-allocator)"
        )
    else:
        logger.info("Memory allocator: %s", name)
    return name


if __name__ == "__main__":  # the image's entry point asks: the library to preload, or nothing
    print(preload(dict(os.environ)).get("LD_PRELOAD", ""))
