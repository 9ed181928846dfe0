"""Token classification (NER) under TorchServe: the handler a `.mar` names, one class.

The task itself: handlers/tasks/token_classification.py.
"""

from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler
from ts_compiled_handlers.tasks.token_classification import TokenClassificationTask


class TokenClassificationHandler(TorchServeHandler):
    task_class = TokenClassificationTask
