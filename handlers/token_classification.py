"""Token classification (NER) under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/token_classification.py.
"""

from ts_compiled_handlers.tasks.token_classification import TokenClassificationTask
from ts_compiled_handlers.torchserve import TorchServeHandler


class TokenClassificationHandler(TorchServeHandler):
    task_class = TokenClassificationTask
