"""Answers as compact JSON text, fast: orjson where it is installed (the package's wheel brings it),
the standard library's json where it is not (an archive served by a TorchServe without it).

An embedding of 384 floats takes the standard library ~146 us and orjson ~6 us (2-core EPYC), which
made JSON the largest cost of a served request's path after the model's inputs (docs/performance.md,
"Where a request's CPU goes"). Both refuse what JSON cannot carry: orjson writes NaN and infinities
as null, so a text holding a null is checked by the standard library before it goes out.
"""

import json
from typing import Any

import numpy as np
import torch

try:
    import orjson
except ImportError:  # served without it: the standard library, same values
    orjson = None


def as_json(answer: Any) -> str:
    """An answer as compact JSON text (a str goes as it is); NaN and other values JSON cannot carry
    raise ValueError or TypeError. numpy arrays (`float32_rows`) are written by orjson directly."""
    if isinstance(answer, str):
        return answer
    if orjson is None:
        return json.dumps(answer, allow_nan=False)
    try:
        text = orjson.dumps(answer, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # what only the standard library carries (an integer past 64 bits)
        return json.dumps(answer, allow_nan=False, default=plain)
    if b"null" in text:  # a None, or a NaN orjson wrote as null: the standard library tells them apart
        json.dumps(answer, allow_nan=False, default=plain)
    return text.decode()


def float32_rows(matrix: torch.Tensor | np.ndarray) -> list:
    """A float32 matrix's rows (torch or numpy) as orjson writes them: the floats that print
    shortest while reading back as the same float32 values, as TEI writes embeddings (4.7 kB of
    JSON for a 384-value row instead of 8 kB for the float64 reprs `tolist()` gives). The rows are
    numpy arrays, which `as_json` writes directly; Python lists where orjson is missing."""
    if isinstance(matrix, torch.Tensor):
        matrix = matrix.detach().cpu().numpy() if matrix.dtype == torch.float32 else matrix
    if orjson is None or not isinstance(matrix, np.ndarray) or matrix.dtype != np.float32:
        return matrix.tolist()
    return list(np.ascontiguousarray(matrix))


def plain(value: Any) -> Any:
    """A numpy row of `float32_rows` as the Python floats `as_json` would write (a NaN or infinity
    kept, for the standard library to refuse); anything else refused, as the standard library's
    `default` does."""
    if not isinstance(value, np.ndarray):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    if orjson is None or not np.isfinite(value).all():
        return value.tolist()
    return orjson.loads(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))
