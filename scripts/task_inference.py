"""Which task serves a model, read from the model's own files, as its reference library would load it.

    sentence-transformers' modules.json with a Pooling module      -> embedding
    a SparseEncoder's config_sentence_transformers.json            -> sparse-embedding
    PyLate's modules.json (a Dense module of PyLate's, no Pooling)  -> multi-vector
    bge-m3's heads, colbert_linear.pt and sparse_linear.pt         -> m3-embedding
    config.json `model_type` clip or siglip, with an image processor's    -> image-text-embedding
    preprocessor_config.json (or processor_config.json's, as sentence-transformers saves it)
    a CrossEncoder's config_sentence_transformers.json             -> text-classification
    config.json `architectures`: *ForSequenceClassification        -> text-classification
                                 *ForTokenClassification           -> token-classification
                                 *ForCausalLM, *LMHeadModel        -> text-generation
Anything else (a bare encoder with no sentence-transformers files, a masked-LM head, several
answers) is ambiguous: the error names the choices, and `--task` decides. A causal LM is never
guessed to be a reranker: that needs `--task text-classification`.
"""

import json
from pathlib import Path

from ts_compiled_handlers.configuration.config import TASKS

HEADS = {
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForCausalLM": "text-generation",
    "LMHeadModel": "text-generation",
}


class AmbiguousTask(ValueError):
    """The model's files do not say which task serves it."""


def read_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def infer_task(model_dir: Path) -> str:
    """The task the model's files say; AmbiguousTask naming the choices otherwise."""
    model_dir = Path(model_dir)
    found = image_text_task(model_dir) or sentence_transformers_task(model_dir) or head_task(model_dir)
    if found is None:
        raise AmbiguousTask(
            f"cannot tell which task serves {model_dir}: it has no sentence-transformers files and no task head "
            f"in config.json's architectures; pass --task, one of {', '.join(TASKS)}"
        )
    return found


IMAGE_TEXT_TYPES = ("clip", "siglip")  # SigLIP 2 (naflex: its images at their own sizes) is not served


def image_text_task(model_dir: Path) -> str | None:
    config = read_json(model_dir / "config.json") or {}
    kind = config.get("model_type") if isinstance(config, dict) else None
    processor = (model_dir / "preprocessor_config.json").is_file() or "image_processor" in (
        read_json(model_dir / "processor_config.json") or {}
    )
    return "image-text-embedding" if kind in IMAGE_TEXT_TYPES and processor else None


def sentence_transformers_task(model_dir: Path) -> str | None:
    if all((model_dir / head).is_file() for head in ("colbert_linear.pt", "sparse_linear.pt")):
        return "m3-embedding"  # bge-m3: FlagEmbedding's heads beside the encoder
    saved = read_json(model_dir / "config_sentence_transformers.json") or {}
    kind = saved.get("model_type") if isinstance(saved, dict) else None
    if kind == "CrossEncoder":
        return "text-classification"
    if kind == "SparseEncoder":
        return "sparse-embedding"
    modules = read_json(model_dir / "modules.json")
    types = [str(module.get("type", "")) for module in modules or [] if isinstance(module, dict)]
    if any(kind.endswith("Pooling") for kind in types):
        return "embedding"
    if any(kind.startswith("pylate.") for kind in types):
        return "multi-vector"
    return None


def head_task(model_dir: Path) -> str | None:
    config = read_json(model_dir / "config.json") or {}
    architectures = config.get("architectures") or [] if isinstance(config, dict) else []
    tasks = {task for name in architectures for suffix, task in HEADS.items() if str(name).endswith(suffix)}
    if len(tasks) > 1:
        raise AmbiguousTask(f"{model_dir}: its architectures say {', '.join(sorted(tasks))}; pass --task")
    return tasks.pop() if tasks else None
