"""What a worker serves, read from the archive before any model is built.

A server says where a worker sits (a `Placement`, handlers/configuration/placement.py);
`read_serving(placement, task)` shares the cores, loads the tokenizer and plans the buckets; the
steps that build the engine (handlers/startup/build_steps.py, handlers/startup/aot_start.py) take
the `Serving` it returns and a task, of which they need only its building hooks
(handlers/tasks/__init__.py).
"""

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoTokenizer

from ts_compiled_handlers.compiling import compile_cache
from ts_compiled_handlers.configuration.config import CompileConfig, HandlerConfig
from ts_compiled_handlers.configuration.placement import Placement
from ts_compiled_handlers.engine import buckets
from ts_compiled_handlers.runtime import hardware, process_settings
from ts_compiled_handlers.startup import warmup
from ts_compiled_handlers.startup.bucket_plan import task_plan

if TYPE_CHECKING:  # the tasks' own modules read Serving
    from ts_compiled_handlers.tasks import Task


@dataclasses.dataclass(frozen=True)
class Serving:
    """What a worker serves, read from the archive before any model is built."""

    config: HandlerConfig
    model_dir: Path
    device: torch.device
    tokenizer: Any
    model_config: Any  # transformers' config of the model
    plan: buckets.BucketPlan
    compile_options: CompileConfig  # the configured ones, `dynamic` as the plan has it
    probes: warmup.Probes

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def tolerance(self, dtype: torch.dtype) -> float:
        return warmup.tolerance(self.config.warmup.tolerance, dtype)


@dataclasses.dataclass(frozen=True)
class Started:
    """How the engine came to be: the warm-up's report, where its compiled code came from
    (CACHE_SOURCES), the seconds until the model was loaded, and the host cache it compiled into."""

    report: warmup.WarmupReport
    cache_source: str
    load_seconds: float
    host_cache: compile_cache.HostCache | None = None


def read_serving(placement: Placement, task: "Task") -> tuple[Serving, process_settings.ThreadShare]:
    """Configuration, this worker's share of the cores, tokenizer and bucket plan."""
    config = task.config  # parsed once, when the task was made
    model_dir = Path(placement.model_dir)
    threads = process_settings.share_cores(config.threads, placement.workers, model_dir)
    gpu_id = placement.gpu_id
    on_cuda = hardware.detect().device == "cuda"  # detected at the handler's import under TorchServe
    device = torch.device(f"cuda:{gpu_id}" if on_cuda and gpu_id is not None else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    if not tokenizer.is_fast:
        raise ValueError(f"{model_dir} has no fast tokenizer (tokenizer.json); offsets and speed need one")
    task.configure_tokenizer(tokenizer)
    model_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    check_vocabulary(tokenizer, model_config)
    plan = task_plan(task, config, model_dir, tokenizer, model_config)
    options = dataclasses.replace(config.compile, dynamic=plan.dynamic)
    serving = Serving(config, model_dir, device, tokenizer, model_config, plan, options, warmup.Probes(tokenizer, plan))
    return serving, threads


def check_vocabulary(tokenizer, model_config) -> None:
    """A token id past the embedding table aborts the whole worker inside a compiled kernel."""
    rows = model_config.get_text_config().vocab_size
    largest = max(tokenizer.get_vocab().values())
    if rows is not None and largest >= rows:
        raise ValueError(f"the tokenizer makes token id {largest} but the model embeds only {rows} tokens")
