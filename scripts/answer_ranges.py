"""An embedding archive's int8/uint8 answer ranges, fixed at build (handlers/tasks/precisions.py).

`hfserve build` embeds the calibration texts (`--calibration FILE`, else the default set of
handlers/quantizing/calibration.py) with the eager float32 model, as the archive serves them (its
pooling, its default prompt, its normalization), and writes each dimension's least and greatest
value into the staged archive. Fixed there, every worker, host and restart quantizes a text alike.
"""

from pathlib import Path

import numpy as np
import torch

from ts_compiled_handlers.configuration.config import HandlerConfig
from ts_compiled_handlers.graphs.pooling import SentenceEmbedder
from ts_compiled_handlers.graphs.sentence_head import read_head
from ts_compiled_handlers.protocols import Request
from ts_compiled_handlers.quantizing.calibration import calibration_texts
from ts_compiled_handlers.tasks.embedding import EmbeddingTask
from ts_compiled_handlers.tasks.precisions import AnswerRanges

BATCH = 8  # texts per model call: a large model's calibration never holds many padded texts at once


def embedded_texts(model_dir: Path, texts: list[str], config: HandlerConfig) -> np.ndarray:
    """The texts' embeddings as the archive answers them by default, (texts, dimensions) float32."""
    from transformers import AutoTokenizer

    task = EmbeddingTask(config)
    task.read_sentence_files(model_dir)
    model = task.load_model(model_dir).eval()
    if task.PER_TOKEN:  # an archive that keeps token states pools after its call; here, as its graph would
        model = SentenceEmbedder(model.encoder, task.pooling, task.head.layers)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "right"  # as the engine pads, and SentenceEmbedder's last token assumes
    limit = task.max_seq_len(model_dir, config) or tokenizer.model_max_length
    texts = sorted(task.model_texts(Request(texts, {}, None)), key=len)  # less padding; ranges ignore order
    pooled = []
    with torch.no_grad():
        for start in range(0, len(texts), BATCH):
            batch = tokenizer(texts[start : start + BATCH], padding=True, truncation=True, max_length=limit)
            tensors = {key: torch.tensor(batch[key]) for key in ("input_ids", "attention_mask")}
            pooled.append(model(tensors["input_ids"], tensors["attention_mask"]).float())
    embeddings = torch.cat(pooled)
    if task.normalize_default:
        embeddings = torch.nn.functional.normalize(embeddings, dim=-1)
    return embeddings.numpy()


def write_ranges(staging: Path, config: HandlerConfig) -> AnswerRanges:
    """The ranges of the staged archive's model over its calibration texts, written beside it."""
    texts = calibration_texts(config.calibration, staging)
    ranges = AnswerRanges.of(embedded_texts(staging, texts, config), read_head(staging).normalizes)
    ranges.write(staging)
    return ranges
