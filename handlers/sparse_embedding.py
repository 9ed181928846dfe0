"""Sparse embeddings (SPLADE) under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/sparse_embedding.py.
"""

from ts_compiled_handlers.tasks.sparse_embedding import SparseEmbeddingTask
from ts_compiled_handlers.torchserve import TorchServeHandler


class SparseEmbeddingHandler(TorchServeHandler):
    task_class = SparseEmbeddingTask
