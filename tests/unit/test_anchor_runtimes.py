"""benchmarks/anchor_runtimes.py: the runtimes the small-shapes benchmark holds ours against answer
the model's own embedding, so that their times are for the same work as ours. A release check
(scripts/release_check.sh installs the `[anchors]` extra they need; the test command does not)."""

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from ts_compiled_handlers.benchmarks.anchor_runtimes import ANCHORS, MeanPooled, anchor_call

TEXTS = ["a short one", "a somewhat longer text about rivers, courts and the price of tea", "ok"]
LEAST_COSINE = {"onnxruntime": 0.9999, "openvino": 0.9999, "onnxruntime-int8": 0.99, "openvino-int8": 0.99}


@pytest.fixture(scope="module")
def eager_answers(tiny_bert):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    ids = tokenizer(TEXTS)["input_ids"]
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        vectors = MeanPooled(AutoModel.from_pretrained(tiny_bert).eval())(batch["input_ids"], batch["attention_mask"])
    return ids, vectors


@pytest.mark.release
@pytest.mark.parametrize("anchor", ANCHORS)
def test_each_anchor_answers_the_models_own_embedding(anchor, tiny_bert, eager_answers, tmp_path):
    ids, expected = eager_answers
    call = anchor_call(anchor, tiny_bert, tmp_path, float32=True, calibration=ids * 4)
    found = call(ids)
    assert found.shape == expected.shape
    cosine = torch.nn.functional.cosine_similarity(found.float(), expected, dim=1)
    assert cosine.min().item() >= LEAST_COSINE[anchor]
