"""The one thread that builds, warms and calls the model under `asyncCommunication: true`.

On CPU, torch runs parallel work on OpenMP, and OpenMP gives every thread that starts parallel work
a team of threads of its own. Once a process holds two teams, libgomp counts more threads than
cores and stops spinning between parallel regions, so every region waits on wake-ups: measured in
process on 2 cores, the compiled MiniLM call at 1x16 took 10 ms in a second thread instead of 5 ms,
and the whole lone request through the scheduler 13 ms instead of 7 ms (docs/performance.md,
"Scheduling by tokens"). So under the token scheduler the worker keeps a single team: `initialize`
(load, compile, warm-up, checks) and every model call run in this thread, and the event loop's
thread, which tokenizes, encodes answers and does the answers' small tensor work, is held to one
thread, where torch starts no team.
"""

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch

logger = logging.getLogger(__name__)

Result = TypeVar("Result")


class ModelThread:
    """A single thread to run model work in, in order."""

    def __init__(self):
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="model-call")

    @classmethod
    def start(cls, build: Callable[..., Result], *args) -> tuple["ModelThread", Result]:
        """A model thread that has run `build(*args)` (the worker's build), the caller then held."""
        thread = cls()
        built = thread.run(build, *args)
        thread.hold_caller_to_one_thread()
        return thread, built

    def run(self, work: Callable[..., Result], *args) -> Result:
        """`work(*args)` in the model thread, waited for; its exception is raised here."""
        return self.executor.submit(work, *args).result()

    def hold_caller_to_one_thread(self) -> None:
        """Keep the calling thread from starting a team of its own.

        `torch.set_num_threads` sets OpenMP's thread count of the calling thread (and the default
        of threads not started yet), so the model thread keeps its own; a build of torch whose pool
        is shared instead would lose it, which is checked, and then undone. It stops new teams only:
        the calling thread must not have started parallel work before (TorchServe's worker starts
        none before the worker is built; measured, the import-time hardware check leaves none that slows)."""
        if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
            return  # a native pool has no teams per thread (and its size is the process's)
        model_threads = self.run(torch.get_num_threads)
        caller_threads = torch.get_num_threads()  # settles this thread's own count first
        torch.set_num_threads(1)
        if self.run(torch.get_num_threads) != model_threads:
            torch.set_num_threads(caller_threads)
            self.run(torch.set_num_threads, model_threads)
            logger.warning("torch's thread count is shared between threads here: the event loop's thread is not held")


def one_thread() -> None:
    """A helper thread's start (the answer thread of handlers/loops/scheduled_requests.py): one OpenMP
    thread, so its tensor work starts no team beside the model thread's."""
    if "ATen parallel backend: OpenMP" in torch.__config__.parallel_info():
        torch.set_num_threads(1)
