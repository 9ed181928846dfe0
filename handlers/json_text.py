"""Answers as compact JSON text, fast: orjson where it is installed (the package's wheel brings it),
the standard library's json where it is not (an archive served by a TorchServe without it).

An embedding of 384 floats takes the standard library ~146 us and orjson ~6 us (2-core EPYC), which
made JSON the largest cost of a served request's path after the model's inputs (docs/performance.md,
"Where a request's CPU goes"). Both refuse what JSON cannot carry: orjson writes NaN and infinities
as null, so a text holding a null is checked by the standard library before it goes out.
"""

import json
from typing import Any

try:
    import orjson
except ImportError:  # served without it: the standard library, same values
    orjson = None


def as_json(answer: Any) -> str:
    """An answer as compact JSON text (a str goes as it is); NaN and other values JSON cannot carry
    raise ValueError or TypeError."""
    if isinstance(answer, str):
        return answer
    if orjson is None:
        return json.dumps(answer, allow_nan=False)
    try:
        text = orjson.dumps(answer, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # what only the standard library carries (an integer past 64 bits)
        return json.dumps(answer, allow_nan=False)
    if b"null" in text:  # a None, or a NaN orjson wrote as null: the standard library tells them apart
        json.dumps(answer, allow_nan=False)
    return text.decode()
