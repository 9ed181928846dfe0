"""LoRA adapters made with PEFT for the tiny models, and PEFT's merged models as the reference
their served answers are held to (tests/unit/test_lora_adapters.py, the task server's archives)."""

import shutil
from pathlib import Path

import torch

ENCODER_ONLY = ["query", "value"]  # inside the layers: packing kept
WITH_POOLER = ["query", "key", "dense"]  # `dense` is the pooler's too: a head, so length groups
TEXTS = ["alice walks to paris", "the cat sat on the mat", "hello", "bob runs to berlin at night"]
QUERY = "where does alice walk"
# name: (seed, target modules, rank) of each adapter made for a model
ADAPTERS = {"one": (1, ENCODER_ONLY, 4), "two": (2, WITH_POOLER, 8)}


def make_adapter(model_class, folder: Path, out: Path, seed: int, targets: list[str], rank: int):
    """A LoRA adapter with random (not zero) factors, saved by PEFT; and PEFT's model merged with it."""
    import peft

    torch.manual_seed(seed)
    model = peft.get_peft_model(
        model_class.from_pretrained(folder),
        peft.LoraConfig(r=rank, lora_alpha=4 * rank, target_modules=targets, init_lora_weights=False),
    )
    model.save_pretrained(out)
    return out, model.merge_and_unload().eval()


def embedder_with_adapters(source: Path, root: Path) -> tuple[Path, dict[str, Path], dict]:
    """A copy of the embedder `source` with ADAPTERS under its adapters/ folder; their folders; and
    sentence-transformers' vectors of TEXTS for the base model (None) and each adapter merged."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    folder = root / "embedder"
    shutil.copytree(source, folder)
    saved, merged = {}, {}
    for name, (seed, targets, rank) in ADAPTERS.items():
        saved[name], merged[name] = make_adapter(AutoModel, folder, root / f"embedder-{name}", seed, targets, rank)
        shutil.copytree(saved[name], folder / "adapters" / name)
    reference = SentenceTransformer(str(folder), device="cpu")
    expected = {None: reference.encode(TEXTS, convert_to_tensor=True)}
    for name, model in merged.items():
        reference[0].auto_model.load_state_dict(model.state_dict())
        expected[name] = reference.encode(TEXTS, convert_to_tensor=True)
    return folder, saved, expected


def ranker_with_adapters(source: Path, root: Path) -> tuple[Path, dict[str, Path], dict]:
    """The same for the cross-encoder `source`: CrossEncoder's scores of (QUERY, text) for each text."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification

    folder = root / "ranker"
    shutil.copytree(source, folder)
    pairs = [(QUERY, text) for text in TEXTS]
    saved, scores = {}, {None: CrossEncoder(str(folder), device="cpu").predict(pairs).tolist()}
    for name, (seed, targets, rank) in ADAPTERS.items():
        model_class = AutoModelForSequenceClassification
        saved[name], merged = make_adapter(model_class, folder, root / f"ranker-{name}", seed + 2, targets, rank)
        shutil.copytree(saved[name], folder / "adapters" / name)
        reference = CrossEncoder(str(folder), device="cpu")
        reference.model.load_state_dict(merged.state_dict())
        scores[name] = reference.predict(pairs).tolist()
    return folder, saved, scores


def cosine_at_least(got: torch.Tensor, want: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(got.float(), want.float()).min().item()
