"""The handler file an archive names for each task: the one handler of this room whose task it is
(`task_class.NAME`), so the task an archive serves and the file TorchServe loads never disagree."""

import inspect
from pathlib import Path

from ts_compiled_handlers.runtime import package_files
from ts_compiled_handlers.servers.torchserve.classification_handler import ClassificationHandler
from ts_compiled_handlers.servers.torchserve.embedding_handler import EmbeddingHandler
from ts_compiled_handlers.servers.torchserve.generation_handler import GenerationHandler
from ts_compiled_handlers.servers.torchserve.sparse_embedding_handler import SparseEmbeddingHandler
from ts_compiled_handlers.servers.torchserve.token_classification_handler import TokenClassificationHandler

HANDLERS = (
    EmbeddingHandler,
    SparseEmbeddingHandler,
    ClassificationHandler,
    TokenClassificationHandler,
    GenerationHandler,
)
# task name -> the handler's file, relative to the package ("servers/torchserve/embedding_handler.py")
HANDLER_FILES = {
    handler.task_class.NAME: Path(inspect.getfile(handler)).relative_to(package_files.PACKAGE).as_posix()
    for handler in HANDLERS
}
