"""Deprecated: `ts_compiled_handlers.servers.ray.data` holds Ray Data's callables now.

Kept for one release so that jobs written for the old path still run.
"""

import warnings

from ts_compiled_handlers.servers.ray.data import ArchiveBatches, Classifier, Embedder, actor_cpus

__all__ = ["ArchiveBatches", "Classifier", "Embedder", "actor_cpus"]
warnings.warn(
    "ts_compiled_handlers.ray_data is deprecated and goes in the next release: "
    "use ts_compiled_handlers.servers.ray.data",
    FutureWarning,
    stacklevel=2,
)
