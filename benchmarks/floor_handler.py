"""TorchServe's floor: a handler that answers every request with an empty JSON list and does nothing
else (no model, no tokenizer). Built like our archives (same batchSize and maxBatchDelay), its lone
query latency is what TorchServe's frontend, batching and worker protocol cost by themselves."""

from ts_compiled_handlers.servers.torchserve.handler import Handler


class FloorHandler(Handler):
    def initialize(self, context):
        self.initialized = True

    def handle(self, data, context):
        return ["[]" for _ in data]
