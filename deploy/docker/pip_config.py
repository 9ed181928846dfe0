"""The host's pip configuration, as the image build can use it (scripts/build_image.sh).

Packages reach the build the way the host's pip gets them: its index URLs and trusted hosts as
they are; its local wheel folders (find-links), which the build cannot see, copied into the build
context's deploy/docker/wheels/ and named /wheels, where the Dockerfile mounts them; its CA
certificates at the path where the build mounts them as a secret. The pip.conf written here goes
to the build as a secret too (index URLs may carry credentials): no layer keeps either. Local index
folders (file:// URLs) and constraint files are left out: the build cannot read them.

    python3 deploy/docker/pip_config.py OUT_PIP_CONF WHEELS_DIR   # prints the CA bundle's path, if any
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CERT_IN_BUILD = "/run/secrets/ca-certificates"  # where the Dockerfile mounts the `ca-certificates` secret
WHEELS_IN_BUILD = "/wheels"


def host_settings() -> dict[str, str]:
    """pip's own view of its configuration: files and PIP_* variables, the later winning."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    settings = {}
    for line in listed.splitlines():
        match = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line)
        if match:
            settings[match[1]] = match[2]
    return settings


def stage_wheels(folders: list[str], wheels: Path) -> int:
    """Hard-link (else copy) the wheels of local folders into the build context; how many."""
    count = 0
    wheels.mkdir(parents=True, exist_ok=True)
    for folder in map(Path, folders):
        for wheel in folder.glob("*.whl"):
            target = wheels / wheel.name
            if not target.exists():
                try:
                    os.link(wheel, target)
                except OSError:
                    shutil.copy2(wheel, target)
            count += 1
    return count


def build_config(settings: dict[str, str], wheels: Path) -> tuple[str, str | None]:
    """The pip.conf for the build, and the host's CA bundle (None: pip's own)."""
    lines = ["[global]"]
    for key in ("index-url", "extra-index-url", "trusted-host", "timeout", "default-timeout"):
        values = [value for value in settings.get(key, "").split() if not value.startswith("file:")]
        if values:
            lines.append(f"{key} = {' '.join(values)}")
    links = settings.get("find-links", "").split()
    remote = [link for link in links if "://" in link and not link.startswith("file:")]
    local = [link.removeprefix("file://") for link in links if link not in remote]
    if stage_wheels(local, wheels):
        remote.append(WHEELS_IN_BUILD)
    if remote:
        lines.append(f"find-links = {' '.join(remote)}")
    cert = settings.get("cert")
    if cert:
        lines.append(f"cert = {CERT_IN_BUILD}")
    return "\n".join(lines) + "\n", cert


def main(out: str, wheels: str) -> None:
    text, cert = build_config(host_settings(), Path(wheels))
    Path(out).write_text(text)
    if cert:
        print(cert)


if __name__ == "__main__":
    main(*sys.argv[1:])
