"""The package's serving files: what a .mar carries of this package, and what the compile cache's
digest covers. The tools installed beside them (`scripts`, `benchmarks`) are left out: a worker
never imports them, and anything else that lands in the package's folder is not ours."""

from pathlib import Path

PACKAGE = Path(__file__).parent.parent  # this file sits in the package's runtime/ room
NAME = __name__.partition(".")[0]  # the import name (the repository keeps its source in handlers/)
TOOLS = ("scripts", "benchmarks")
# The handler file every archive names, relative to the package: a name, not an import, so that
# `hfserve build` does not import TorchServe's base handler (it logs warnings at import).
HANDLER = "servers/torchserve/handler.py"
TORCHSERVE_FILES = PACKAGE / "servers" / "torchserve"  # config.properties, metrics.yaml, log4j2.xml
SUFFIXES = (".py", ".yaml", ".cpp", ".h")  # C++: the per-text attention operator, built on the serving host


def serving_files(package: Path = PACKAGE) -> list[Path]:
    """The package's modules and data files a worker reads, relative to `package`, sorted."""
    found = (path.relative_to(package) for path in package.rglob("*") if path.suffix in SUFFIXES and path.is_file())
    return sorted(path for path in found if path.parts[0] not in TOOLS and "__pycache__" not in path.parts)
