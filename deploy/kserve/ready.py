"""Readiness probe for a TorchServe pod: exit 0 only when every model has all its workers warm.

    python3 /mnt/models/config/ready.py [http://127.0.0.1:8081]

TorchServe's /ping answers 200 while workers are still starting (measured with TorchServe 0.12),
so it cannot tell a pod that is compiling from one that serves. A worker reaches READY only after
the handler's initialize (compile, warm-up over the grid, compiled-vs-eager check), so this asks
the management API (loopback, inside the pod) for each model's workers. Standard library only:
it runs in the serving image, from the storage layout (scripts/kserve_layout.py copies it there).
"""

import json
import sys
import urllib.request


def get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def ready(management: str) -> bool:
    models = get(f"{management}/models")["models"]
    for model in models:
        for version in get(f"{management}/models/{model['modelName']}/all"):
            workers = [worker for worker in version["workers"] if worker["status"] == "READY"]
            if len(workers) < max(1, version["minWorkers"]):
                return False
    return bool(models)


if __name__ == "__main__":
    try:
        sys.exit(0 if ready(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8081") else 1)
    except OSError as error:  # not listening yet, or refused
        sys.exit(f"not ready: {error}")
