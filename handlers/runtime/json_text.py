"""Answers as compact JSON text, fast: orjson where it is installed (the package's wheel brings it),
the standard library's json where it is not (an archive served by a TorchServe without it).

An embedding of 384 floats takes the standard library ~146 us and orjson ~6 us (2-core EPYC), which
made JSON the largest cost of a served request's path after the model's inputs (docs/performance.md,
"Where a request's CPU goes"). Both refuse what JSON cannot carry: orjson writes NaN and infinities
as null, so a text holding a null is checked by the standard library before it goes out. A task's
answer (a dataclass of handlers/request/answers.py) goes as the object of its fields, those that
are None left out.
"""

import json
from typing import Any

import numpy as np

from ts_compiled_handlers.request.answers import fields

try:
    import orjson
except ImportError:  # served without it: the standard library, same values
    orjson = None
else:
    OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_PASSTHROUGH_DATACLASS


def as_json(answer: Any) -> str:
    """An answer as compact JSON text (a str goes as it is); NaN and other values JSON cannot carry
    raise ValueError or TypeError. A float32 numpy row (C-contiguous) is written by orjson directly:
    the floats that print shortest while reading back as the same float32 values, as TEI writes
    embeddings (4.7 kB of JSON for a 384-value row instead of 8 kB for the float64 reprs of `tolist()`)."""
    if isinstance(answer, str):
        return answer
    if orjson is None:
        return json.dumps(answer, allow_nan=False, default=plain)
    try:
        text = orjson.dumps(answer, default=fields, option=OPTIONS)
    except TypeError:  # what only the standard library carries (an integer past 64 bits)
        return json.dumps(answer, allow_nan=False, default=plain)
    if b"null" in text:  # a None, or a NaN orjson wrote as null: the standard library tells them apart
        json.dumps(answer, allow_nan=False, default=plain)
    return text.decode()


def plain(value: Any) -> Any:
    """A numpy row as the Python floats `as_json` would write (a NaN or infinity
    kept, for the standard library to refuse), an answer as its `fields`; anything else refused,
    as the standard library's `default` does."""
    if not isinstance(value, np.ndarray):
        return fields(value)
    if orjson is None or not np.isfinite(value).all():
        return value.tolist()
    return orjson.loads(orjson.dumps(np.ascontiguousarray(value), option=orjson.OPT_SERIALIZE_NUMPY))
