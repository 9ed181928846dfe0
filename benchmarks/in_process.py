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


def ready_handler(handler_class, model_dir, **handler_config):
    """A handler initialized in process with float32 and `handler_config` under `handler:`."""
    import torch
    from torch._dynamo.utils import counters

    if handler_config.get("compile", {}).get("enable", True):  # an eager handler leaves compiled ones alone
        torch._dynamo.reset()
        counters.clear()  # compiled_graph_count() counts from here
    handler = handler_class()
    handler.initialize(make_context(model_dir, {"handler": {"dtype": "float32", **handler_config}}))
    return handler


def build_aot_package(handler_class, model_dir, yaml_config: dict) -> dict:
    """The AOT package of `model_dir` built in place, as `hfserve build --precompile aot` builds it
    (without the build's own checks); the build's timings."""
    from ts_compiled_handlers.startup import aot_start, build_steps
    from ts_compiled_handlers.startup.placement import Placement

    placement = Placement(model_dir, "test", yaml_config)
    task, serving, _ = handler_class.worker_class.read(placement, handler_class.task_class)
    return aot_start.build_package(task, serving, build_steps.eager_engine(task, serving))
