"""`--model` as a folder or a Hugging Face Hub id, resolved from the local cache unless downloads are allowed.

A Hub id (`BAAI/bge-small-en-v1.5`) is looked up with `huggingface_hub.snapshot_download` in the
cache `HF_HUB_CACHE` / `HF_HOME` point to, offline (`local_files_only`) by default: a build never
reaches the network unless `--allow-download` says it may, and then fetches only the files
serving reads (build_mar.MODEL_FILES, and the settings of sentence-transformers' modules).
"""

import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a download fetches: the files serving reads, and the JSON settings of sentence-transformers' modules.
DOWNLOAD_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*/*.json")


class HubError(ValueError):
    """A Hub id that cannot be resolved: not cached (offline), or not on the Hub."""


def resolve(model: str | Path, revision: str | None = None, allow_download: bool = False) -> Path:
    """The folder of `model`: itself if it is one, else the snapshot of the Hub id it names."""
    folder = Path(model)
    if folder.exists() or not HUB_ID.match(str(model)):
        return folder
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        path = snapshot_download(
            str(model),
            revision=revision,
            local_files_only=not allow_download,
            allow_patterns=list(DOWNLOAD_PATTERNS),
        )
    except LocalEntryNotFoundError as error:
        how = "it could not be downloaded" if allow_download else "downloads are off (pass --allow-download)"
        raise HubError(
            f"{model} (revision {revision or 'main'}) is not in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) and {how}; fetch it once with `hf download {model}`, "
            "or pass the model's folder"
        ) from error
    except HfHubHTTPError as error:
        raise HubError(f"{model}: the Hub refused it ({type(error).__name__}); check the id and your token") from error
    return Path(path)
