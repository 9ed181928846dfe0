"""The handler file every archive `hfserve build` makes names: one for every task.

TorchServe loads it from the archive's root and builds its one class; which task it serves is read
from the archive's model-config.yaml (`handler.task`), and everything else is the adapter's
(handlers/servers/torchserve/adapter.py). A handler of your own (`hfserve build --handler`)
subclasses this class or the adapter's, as this one does.
"""

from ts_compiled_handlers.runtime import hardware
from ts_compiled_handlers.servers.torchserve.adapter import TorchServeHandler

# ---- At module load, once per worker process, before TorchServe builds any model ---------------
# The device is detected; on CUDA with compute capability >= 8.0, float32 matmuls run as TF32
# (torch.set_float32_matmul_precision("high")). Logged either way, with the CPU's bfloat16
# features, which pick `dtype: auto` (handlers/runtime/hardware.py). The one process-wide
# setting this package makes at import; every other one is made when the worker starts.
hardware.detect()


class Handler(TorchServeHandler):
    """Serves the archive's task: embeddings, ranking, labels, spans or generated text."""
