"""What a request comes to, whatever loop serves it: its result, or a `RequestError` (status, code, field).

Every loop (request batches, the token scheduler, the decode loop) keeps a failure to the request
that caused it with the same two pieces:
- `isolate(items, run)`: a model call over many requests that raises is run again on halves of
  them, down to single ones, so only a request that fails on its own gets the error;
- `refusal(error, where)`: any exception as the `RequestError` the client gets. A client error is
  itself; anything else is a bug: logged with the code locations it went through (but not its
  message, which can quote the request), answered 500.
Each protocol shapes the error body from the `RequestError` (`Protocol.error`).
"""

import logging
import traceback
from typing import Any, Callable, Sequence, TypeVar

from ts_compiled_handlers.request.payload import RequestError

logger = logging.getLogger(__name__)

INTERNAL = "internal error while handling this request; the server log has the cause"
Item = TypeVar("Item")


def internal_error() -> RequestError:
    return RequestError(500, INTERNAL)


def refusal(error: BaseException, where: str) -> RequestError:
    """The error a client gets for `error`; a bug (anything but a RequestError) is logged first."""
    if isinstance(error, RequestError):
        return error
    logger.error("A request failed in %s: %s", where, describe(error))
    return internal_error()


def isolate(
    items: Sequence[Item],
    run: Callable[[list[Item]], list[Any]],
    on_split: Callable[[BaseException], None] = lambda error: None,
) -> list[Any]:
    """`run(items)`'s outputs, one per item; where it raises, each half again, so an item's outcome
    is its output or, if it failed alone, its exception. `on_split` hears of every split."""
    items = list(items)
    try:
        outputs = run(items)
    except Exception as error:  # the model call's errors have no fixed type
        if len(items) == 1:
            return [error]
        logger.warning("A call over %d requests raised %s; retrying each half", len(items), type(error).__name__)
        on_split(error)
        half = len(items) // 2
        return isolate(items[:half], run, on_split) + isolate(items[half:], run, on_split)
    if len(outputs) != len(items):
        raise RuntimeError(f"a call over {len(items)} requests returned {len(outputs)} outputs")
    return list(outputs)


def describe(error: BaseException) -> str:
    """The exception's type, its causes' types and the code locations, but not the messages."""
    causes = []
    cause: BaseException | None = error
    while cause is not None and len(causes) < 8:
        causes.append(type(cause).__name__)
        cause = cause.__cause__ or cause.__context__
    frames = traceback.extract_tb(error.__traceback__)[-12:]
    where = "".join(f"\n  {frame.filename}:{frame.lineno} in {frame.name}" for frame in frames)
    return " <- ".join(causes) + " (message withheld: it may quote the request)" + where
