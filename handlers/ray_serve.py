"""Deprecated: `ts_compiled_handlers.servers.ray.serve:app` is the Ray Serve application's new path.

Kept for one release so that Serve configs and commands written for the old path still deploy.
"""

import warnings

from ts_compiled_handlers.servers.ray.serve import AppArgs, ArchiveReplica, app

__all__ = ["AppArgs", "ArchiveReplica", "app"]
warnings.warn(
    "ts_compiled_handlers.ray_serve is deprecated and goes in the next release: "
    "use ts_compiled_handlers.servers.ray.serve:app",
    FutureWarning,
    stacklevel=2,
)
