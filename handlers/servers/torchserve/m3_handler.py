"""bge-m3's three outputs under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/m3.py.
"""

from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler
from ts_compiled_handlers.tasks.m3 import M3EmbeddingTask


class M3Handler(TorchServeHandler):
    task_class = M3EmbeddingTask
