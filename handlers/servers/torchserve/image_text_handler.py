"""Image and text embeddings (CLIP) under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/image_text.py.
"""

from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler
from ts_compiled_handlers.tasks.image_text import ImageTextTask


class ImageTextHandler(TorchServeHandler):
    task_class = ImageTextTask
