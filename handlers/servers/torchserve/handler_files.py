"""The handler file an archive names for each task, whose one class serves that task
(tests/unit/test_placement.py holds each file to it).

Names, not imports: `hfserve build` must not import TorchServe's base handler, which logs its
optional-backend warnings at import time."""

# task name -> the handler's file, relative to the package
HANDLER_FILES = {
    "embedding": "servers/torchserve/embedding_handler.py",
    "sparse-embedding": "servers/torchserve/sparse_embedding_handler.py",
    "multi-vector": "servers/torchserve/multi_vector_handler.py",
    "m3-embedding": "servers/torchserve/m3_handler.py",
    "image-text-embedding": "servers/torchserve/image_text_handler.py",
    "text-classification": "servers/torchserve/classification_handler.py",
    "token-classification": "servers/torchserve/token_classification_handler.py",
    "text-generation": "servers/torchserve/generation_handler.py",
}
