"""Sparse embeddings (SPLADE) under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/sparse_embedding.py.
"""

from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler
from ts_compiled_handlers.tasks.sparse_embedding import SparseEmbeddingTask


class SparseEmbeddingHandler(TorchServeHandler):
    task_class = SparseEmbeddingTask
