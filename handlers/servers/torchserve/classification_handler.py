"""Text classification, text pairs and reranking under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/classification.py.
"""

from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler
from ts_compiled_handlers.tasks.classification import ClassificationTask


class ClassificationHandler(TorchServeHandler):
    task_class = ClassificationTask
