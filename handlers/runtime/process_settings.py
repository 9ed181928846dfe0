"""Every process-wide torch setting the handlers make, in one place.

torch keeps these per process, not per model; a TorchServe worker is one process serving one model,
so the handler may set them. TF32 is the exception: it is switched on by `hardware.detect()` when
the handler module is imported (handlers/servers/torchserve/handler.py), as the product promises.
Each setting is made at the one moment it can be known, by the function named for it:

- `share_cores()`, as the configuration is read (a worker and the build's precompile step alike):
  intra-op threads, a share of the cores that `ThreadShare` re-applies as workers come and go;
- `use_inductor_cache()`, when the worker leases its copy of the host's compile cache: where
  inductor reads and writes compiled kernels ($TORCHINDUCTOR_CACHE_DIR);
- `configure_compiler()`, just before `torch.compile`: inductor's caching and threading, sizes
  compiled size-oblivious, and dynamo's recompile limit (raised again by `allow_graphs()` when the
  grid is traced at a new thread count);
- `stop_compile_workers()`, once compiling is over.

A worker serving an AOT package reaches only the first: importing dynamo or inductor's compiler
would slow its start, so nothing here imports them before it compiles.
"""

import logging
import os
import time
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from ts_compiled_handlers.runtime import hardware
from ts_compiled_handlers.runtime.live_workers import LiveWorkers

logger = logging.getLogger(__name__)

# Inductor's cache directory. Code that starts servers or workers (benchmarks, tests) sets it by this name.
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
PRECOMPILED_HEADERS_ENV = "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"  # torch's; "1" turns them on
RECOUNT_SECONDS = 1.0


class ThreadShare:
    """`cores // live workers` intra-op threads (at least 1), re-applied when the count changes."""

    def __init__(self, live: LiveWorkers | None, cores: int, fixed: int | None = None, starting: int = 1):
        self.live = live
        self.cores = cores
        self.fixed = fixed  # a `threads: N` from the config: kept whatever the worker count
        # `starting` workers (minWorkers) start together: count them before all have registered.
        self.workers = max(starting, live.count() if live is not None else 1)
        self.threads = self._apply()
        self.checked = time.monotonic()

    def _apply(self) -> int:
        threads = self.fixed or max(1, self.cores // max(1, self.workers))
        torch.set_num_threads(threads)
        return threads

    def refresh(self) -> bool:
        """Recount the live workers (at most once a second) and re-apply the share; True when the
        thread count changed."""
        now = time.monotonic()
        if self.fixed is not None or self.live is None or now - self.checked < RECOUNT_SECONDS:
            return False
        self.checked = now
        workers = self.live.count()
        if workers == self.workers:
            return False
        self.workers = workers
        threads, self.threads = self.threads, self._apply()
        if threads == self.threads:
            return False
        logger.info(
            "Threads re-shared: %d (live workers of this model: %d, cores: %d)", self.threads, workers, self.cores
        )
        return True


def share_cores(threads: int | None, min_workers: int, model_dir: Path | None) -> ThreadShare:
    """Give this worker its share of the cores.

    A single worker pinned to one thread would leave the other cores idle, so the default divides
    the cores by the live workers of the model (at least `min_workers`, which start together)
    instead of pinning everyone to one thread, and follows that count as it changes (docs/design.md,
    "Hardware, dtype and threads").
    """
    live = None
    if model_dir is not None and threads is None:  # a fixed `threads: N` never follows the count
        try:
            live = LiveWorkers(model_dir)
        except OSError as error:  # no writable temp dir: keep the share minWorkers gives
            logger.warning("Threads will not follow the live workers: %s", error)
    share = ThreadShare(live, hardware.usable_cores(), threads, min_workers)
    logger.info("Worker settings: %d threads, %d cores, %d workers", share.threads, share.cores, share.workers)
    return share


def use_inductor_cache(directory: Path) -> None:
    """Send inductor's reads and writes to `directory` from now on in this process."""
    from torch._inductor.utils import clear_caches

    os.environ[INDUCTOR_CACHE_ENV] = str(directory)
    clear_caches()


def configure_compiler(dynamic: str, graphs_needed: int, freezing: bool = False) -> None:
    """Inductor's and dynamo's settings for compiling the bucket grid (`dynamic`: the plan's
    dynamic dimensions; `graphs_needed`: the graphs its warm-up compiles; `freezing`: the weights
    become the graph's constants)."""
    import torch._inductor.config as inductor_config
    import torch.fx.experimental._config as fx_config

    inductor_config.fx_graph_cache = True
    # A served model's weights never change: frozen, they are folded into the graph and, on the CPU,
    # prepacked for oneDNN's matmuls once instead of at every call (benchmarks/benchmark_small_shapes.py).
    inductor_config.freezing = freezing
    # Inductor precompiles a large C++ header in the temp dir before it even looks for a cached
    # kernel, so with it a worker whose kernels all come from the cache still paid that at every
    # fresh host. Off unless torch's own variable asks for it: many cold compiles on one host (the
    # tests) compile their kernels in half the CPU with it (docs/design.md, "Cold start and AOT packages").
    inductor_config.cpp_cache_precompile_headers = os.environ.get(PRECOMPILED_HEADERS_ENV) == "1"
    # Compiled CPU kernels read the thread count when they run instead of baking it in at compile
    # time, so a worker's share of the cores can change as workers come and go (what that costs
    # per call: benchmarks/benchmark_threads.py, docs/performance.md "Workers and threads").
    inductor_config.cpp.dynamic_threads = True
    # Size-oblivious sizes: a dynamic dimension of size 1 shares the graph of the other sizes
    # instead of getting its own (dynamo specializes 0 and 1 otherwise), which saves compiling a
    # second graph for a grid with batch size 1 (docs/design.md, "Shape strategy"). The warm-up
    # graph count and the compiled-vs-eager check stand guard over it.
    fx_config.backed_size_oblivious = dynamic != "none"
    allow_graphs(graphs_needed)


def allow_graphs(graphs: int) -> None:
    """Let dynamo keep at least `graphs` graphs per code object: past its `recompile_limit` it
    silently falls back to eager."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs)


def kernels_follow_thread_count() -> bool:
    """Whether CPU kernels compiled from now on read the thread count when they run."""
    import torch._inductor.config as inductor_config

    return inductor_config.cpp.dynamic_threads


def thread_count_baked_in() -> AbstractContextManager:
    """Kernels compiled inside it have the thread count of their compile fixed in their code
    (what workers avoid; benchmarks/benchmark_threads.py measures the difference)."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch({"cpp.dynamic_threads": False})


def stop_compile_workers() -> None:
    """Inductor's pool of compile subprocesses would idle in every worker for nothing."""
    from torch._inductor.async_compile import shutdown_compile_workers

    shutdown_compile_workers()
