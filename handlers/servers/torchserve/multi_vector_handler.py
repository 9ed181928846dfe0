"""Multi-vector (ColBERT) embeddings under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/multi_vector.py.
"""

from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler
from ts_compiled_handlers.tasks.multi_vector import MultiVectorTask


class MultiVectorHandler(TorchServeHandler):
    task_class = MultiVectorTask
