"""The requirements a wheel declares for a plain install (no extras), one per line: the image
installs them in a layer of their own, which a change to this package's code leaves cached.

    python3 requirements.py dist/ts_compiled_handlers-*.whl > requirements.txt
"""

import sys
import zipfile
from email.parser import Parser


def requirements(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(entry for entry in archive.namelist() if entry.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    return [line for line in metadata.get_all("Requires-Dist", []) if "extra ==" not in line]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
