"""Text generation under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/generation.py.
"""

from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler
from ts_compiled_handlers.tasks.generation import GenerationTask


class GenerationHandler(TorchServeHandler):
    task_class = GenerationTask
