"""Sentence embeddings under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/embedding.py.
"""

from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler
from ts_compiled_handlers.tasks.embedding import EmbeddingTask


class EmbeddingHandler(TorchServeHandler):
    task_class = EmbeddingTask
