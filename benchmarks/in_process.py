"""A handler driven in process, without TorchServe: what the in-process benchmarks and the unit
tests both need, so that neither imports from the other."""

from ts.context import Context, RequestProcessor


def make_context(model_dir, yaml_config: dict, batch_size: int = 8, gpu=None) -> Context:
    """A real ts.context.Context as TorchServe builds it, without a metrics cache."""
    manifest = {"model": {"modelName": "test", "handler": "embedding.py"}}
    return Context("test", str(model_dir), manifest, batch_size, gpu, "0.12.0", model_yaml_config=yaml_config)


def start_batch(context: Context, content_types: list[str]) -> None:
    """Give the context one RequestProcessor per request, as TorchServe does per batch."""
    context.request_processor = [RequestProcessor({"body": {"content-type": ct}}) for ct in content_types]


def ready_handler(served, model_dir, **handler_config):
    """A handler initialized in process with float32 and `handler_config` under `handler:`.
    `served`: a task's name (TorchServe's handler, that task in its config), or a handler class
    (its task: `handler_config`'s, else the configuration's default)."""
    import torch
    from torch._dynamo.utils import counters

    from ts_compiled_handlers.servers.torchserve.handler import Handler

    if handler_config.get("compile", {}).get("enable", True):  # an eager handler leaves compiled ones alone
        torch._dynamo.reset()
        counters.clear()  # compiled_graph_count() counts from here
    if isinstance(served, str):
        served, handler_config = Handler, {"task": served, **handler_config}
    handler = served()
    handler.initialize(make_context(model_dir, {"handler": {"dtype": "float32", **handler_config}}))
    return handler


def build_aot_package(task: str, model_dir, yaml_config: dict) -> dict:
    """The AOT package of `model_dir` for `task` built in place, as `hfserve build --precompile aot`
    builds it (without the build's own checks); the build's timings."""
    from ts_compiled_handlers.configuration.placement import Placement
    from ts_compiled_handlers.startup import aot_start, build_steps
    from ts_compiled_handlers.tasks.registry import task_class
    from ts_compiled_handlers.worker.worker import Worker

    yaml_config = {**yaml_config, "handler": {**yaml_config.get("handler", {}), "task": task}}
    placement = Placement(model_dir, "test", yaml_config)
    task, serving, _ = Worker.read(placement, task_class(task))
    return aot_start.build_package(task, serving, build_steps.eager_engine(task, serving))
