"""Comparing our answers with the reference libraries': labels and spans exact, scores within 1e-4."""

import math

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

SCORE_TOLERANCE = 1e-4


def assert_same_answers(ours, reference, path="answer", tolerance=SCORE_TOLERANCE):
    """Equal structure and values, except floats, which may differ by `tolerance`."""
    if isinstance(reference, dict):
        assert set(ours) == set(reference), f"{path}: keys {sorted(ours)} != {sorted(reference)}"
        for key in reference:
            assert_same_answers(ours[key], reference[key], f"{path}.{key}", tolerance)
    elif isinstance(reference, list):
        assert len(ours) == len(reference), f"{path}: {len(ours)} items, pipeline has {len(reference)}"
        for index, (got, want) in enumerate(zip(ours, reference, strict=True)):
            assert_same_answers(got, want, f"{path}[{index}]", tolerance)
    elif isinstance(reference, str) or reference is None or isinstance(reference, bool):
        assert ours == reference, f"{path}: {ours!r} != {reference!r}"
    else:  # numbers, numpy scalars included
        assert math.isclose(float(ours), float(reference), abs_tol=tolerance), f"{path}: {ours} != {reference}"


def generate_alone(model_dir, prompt: str, new_tokens: int) -> str:
    """Eager greedy `generate()` of transformers for the prompt alone: the text it adds."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    inputs = tokenizer(prompt, return_tensors="pt")
    output = lm.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
