"""What a client sent, checked before any model work, and the error a request gets.

Once a body is read into text or JSON (handlers/protocols/__init__.py), the protocols check its
texts and parameters with the checks here. Anything wrong raises `RequestError` with a 4xx status
and a message that says what was wrong without echoing the input back (request text is never
logged or returned).
"""

from typing import Any, Callable

HTTP_PHRASES = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def phrase(status: int) -> str:
    """HTTP's reason phrase for a status."""
    return HTTP_PHRASES.get(status, "Server Error" if status >= 500 else "Client Error")


class RequestError(Exception):
    """Why one request is not answered with its result: its HTTP `status` (a client's 4xx, or the
    server's 500 and 503), a message that never quotes the request, the `field` of the body it is
    about (if one), and a machine-readable `code` (OpenAI's `model_not_found`...). Each protocol
    shapes its own error body from these; the other requests of a batch are still answered."""

    def __init__(self, status: int, message: str, field: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.code = code

    def body(self) -> dict:
        return {"error": self.message, "code": self.status}


ParamCheck = Callable[[Any, str], Any]


def boolean_param(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(400, f"parameter '{name}' must be true or false", name)
    return value


def choice_param(*options: str) -> ParamCheck:
    def check(value: Any, name: str) -> str:
        if value not in options:
            raise RequestError(400, f"parameter '{name}' must be one of: {', '.join(options)}", name)
        return value

    return check


def int_param(low: int, high: int) -> ParamCheck:
    def check(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise RequestError(400, f"parameter '{name}' must be an integer from {low} to {high}", name)
        return value

    return check


def number_param(low: float, high: float) -> ParamCheck:
    """A number in (low, high]: the lower bound itself is excluded (temperature 0, top_p 0)."""

    def check(value: Any, name: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= high:
            raise RequestError(400, f"parameter '{name}' must be a number above {low} and at most {high}", name)
        return float(value)

    return check


def is_unicode_text(text: str) -> bool:
    """True unless `text` holds a lone surrogate (U+D800-U+DFFF), which JSON's \\u escapes allow but
    UTF-8 cannot encode; the tokenizer takes exactly the strings UTF-8 can encode (tests/unit/test_payload.py)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_texts(inputs: list, max_inputs: int, name: str = "inputs") -> list[str]:
    """A non-empty list of at most `max_inputs` non-blank strings (`name`: the field, for messages)."""
    if not inputs:
        raise RequestError(400, f"'{name}' is an empty list: send at least one text", name)
    if len(inputs) > max_inputs:
        raise RequestError(413, f"'{name}' has {len(inputs)} texts; at most {max_inputs} per request", name)
    for position, text in enumerate(inputs):
        if not isinstance(text, str):
            raise RequestError(400, f"'{name}'[{position}] is not a string", name)
        if not text.strip():
            raise RequestError(400, f"'{name}'[{position}] is empty", name)
        if not is_unicode_text(text):
            raise RequestError(
                400, f"'{name}'[{position}] holds a lone surrogate (U+D800-U+DFFF), not Unicode text", name
            )
    return list(inputs)


def check_params(values: dict, param_checks: dict[str, ParamCheck]) -> dict[str, Any]:
    """Each parameter checked by its task's check; an unknown one is refused without repeating it."""
    params = {}
    for name, value in values.items():
        if name not in param_checks:
            allowed = ", ".join(sorted(param_checks)) or "none"
            raise RequestError(400, f"unknown parameter (names are not echoed back); allowed: {allowed}")
        params[name] = param_checks[name](value, name)
    return params
