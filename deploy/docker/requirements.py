"""The requirements a wheel declares for a plain install and for the extras named after it, one per
line: the image installs them in a layer of their own, which a change to this package's code leaves
cached. The image takes the `images` extra (Pillow, sentencepiece), so it serves CLIP and SigLIP too.

    python3 requirements.py dist/ts_compiled_handlers-*.whl images > requirements.txt
"""

import re
import sys
import zipfile
from email.parser import Parser

EXTRA = re.compile(r"""^\s*extra\s*==\s*["']([^"']+)["']\s*$""")


def requirements(wheel: str, extras: tuple[str, ...] = ()) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(entry for entry in archive.namelist() if entry.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    chosen = []
    for line in metadata.get_all("Requires-Dist", []):
        requirement, _, marker = line.partition(";")
        if "extra" not in marker:
            chosen.append(line)
        elif (found := EXTRA.match(marker)) and found.group(1) in extras:
            chosen.append(requirement.strip())
    return chosen


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], tuple(sys.argv[2:]))))
