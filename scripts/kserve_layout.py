"""The storage layout KServe's TorchServe runtime reads from an InferenceService's storageUri.

    python scripts/kserve_layout.py model_store/minilm.mar --out runs/kserve [--batch-size 32 --workers 1]

writes
    runs/kserve/config/config.properties   deploy/kserve/config.properties (the Kubernetes profile)
                                           with model_snapshot listing the archives
    runs/kserve/config/metrics.yaml        the package's metrics.yaml (our gauges and counters)
    runs/kserve/config/log4j2.xml          the package's log4j2.xml (the frontend's logging, no lines per request)
    runs/kserve/config/ready.py            deploy/kserve/ready.py (the readiness probe)
    runs/kserve/model-store/<name>.mar     the archives, packed compile cache and all
to be copied to the volume (deploy/kserve/storage.yaml says how). Each model's name and version
come from its archive's manifest; its responseTimeout, and its batchSize and maxBatchDelay unless
given, from its model-config.yaml.
"""

import argparse
import json
import shutil
import string
import zipfile
from pathlib import Path

import yaml

from ts_compiled_handlers.runtime import package_files

PROFILE = Path("deploy") / "kserve" / "config.properties"  # run from the repository's root


def archive_entry(
    mar: Path, batch_size: int | None, max_batch_delay: int | None, workers: int
) -> tuple[str, str, dict]:
    """(model name, version, model_snapshot entry) of one archive."""
    with zipfile.ZipFile(mar) as archive:
        model = json.loads(archive.read("MAR-INF/MANIFEST.json"))["model"]
        config = yaml.safe_load(archive.read("model-config.yaml")) if "model-config.yaml" in archive.namelist() else {}
    entry = {
        "defaultVersion": True,
        "marName": mar.name,
        "minWorkers": workers,
        "maxWorkers": workers,
        "batchSize": batch_size or config.get("batchSize", 1),  # TorchServe's own defaults where the archive has none
        "maxBatchDelay": max_batch_delay or config.get("maxBatchDelay", 100),
        "responseTimeout": config.get("responseTimeout", 120),
    }
    return model["modelName"], model["modelVersion"], entry


def model_snapshot(entries: list[tuple[str, str, dict]]) -> dict:
    models: dict[str, dict] = {}
    for name, version, entry in entries:
        models.setdefault(name, {})[version] = entry
    return {"name": "startup.cfg", "modelCount": len(entries), "models": models}


def render(snapshot: dict, profile: Path = PROFILE) -> str:
    return string.Template(profile.read_text()).substitute(MODEL_SNAPSHOT=json.dumps(snapshot, separators=(",", ":")))


def write_layout(
    archives: list[Path],
    out: Path,
    batch_size: int | None,
    max_batch_delay: int | None,
    workers: int,
    profile: Path = PROFILE,
) -> Path:
    entries = [archive_entry(mar, batch_size, max_batch_delay, workers) for mar in archives]
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / "model-store").mkdir(parents=True, exist_ok=True)
    (out / "config" / "config.properties").write_text(render(model_snapshot(entries), profile))
    shutil.copy2(package_files.TORCHSERVE_FILES / "metrics.yaml", out / "config" / "metrics.yaml")
    shutil.copy2(package_files.TORCHSERVE_FILES / "log4j2.xml", out / "config" / "log4j2.xml")
    shutil.copy2(profile.parent / "ready.py", out / "config" / "ready.py")
    for mar in archives:
        shutil.copy2(mar, out / "model-store" / mar.name)
    return out


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archives", type=Path, nargs="+", help=".mar files built by build_mar.py")
    parser.add_argument("--out", type=Path, default=Path("runs") / "kserve", help="the layout's root")
    parser.add_argument("--batch-size", type=int, help="TorchServe batch size, every model (default: each archive's)")
    parser.add_argument("--max-batch-delay", type=int, help="ms to wait to fill a batch (default: each archive's)")
    parser.add_argument("--workers", type=int, default=1, help="workers per model in each pod")
    parser.add_argument("--profile", type=Path, default=PROFILE, help="the Kubernetes config.properties template")
    args = parser.parse_args(argv)
    missing = [str(mar) for mar in args.archives if not mar.is_file()]
    if missing:
        parser.exit(2, f"kserve_layout: no such archive: {', '.join(missing)}\n")
    out = write_layout(args.archives, args.out, args.batch_size, args.max_batch_delay, args.workers, args.profile)
    print(out)
    return out


if __name__ == "__main__":
    main()
