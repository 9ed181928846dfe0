"""Every task by its name, so that a server reads which task an archive serves from its
model-config.yaml (`handler.task`) without importing any server's code."""

from ts_compiled_handlers.tasks import Task
from ts_compiled_handlers.tasks.classification import ClassificationTask
from ts_compiled_handlers.tasks.embedding import EmbeddingTask
from ts_compiled_handlers.tasks.generation import GenerationTask
from ts_compiled_handlers.tasks.image_text import ImageTextTask
from ts_compiled_handlers.tasks.m3 import M3EmbeddingTask
from ts_compiled_handlers.tasks.multi_vector import MultiVectorTask
from ts_compiled_handlers.tasks.sparse_embedding import SparseEmbeddingTask
from ts_compiled_handlers.tasks.token_classification import TokenClassificationTask

TASK_CLASSES: dict[str, type[Task]] = {
    task.NAME: task
    for task in (
        EmbeddingTask,
        SparseEmbeddingTask,
        MultiVectorTask,
        M3EmbeddingTask,
        ImageTextTask,
        ClassificationTask,
        TokenClassificationTask,
        GenerationTask,
    )
}


def task_class(name: str) -> type[Task]:
    return TASK_CLASSES[name]
