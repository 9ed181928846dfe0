"""Repeated texts answered from the model's rows of before (`handler.cache_bytes`, off by default).

Re-indexing jobs and RAG traffic send the same texts again and again. A text's output rows depend
only on what the model reads: its token ids, token types and adapter (the prompt, truncation and
query expansion are in the ids already), so they are the key; every request parameter acts after the
model, in the task's answer, and a cached row is answered like a computed one. The rows are kept,
least recently used first out, up to a bound in bytes; a repeat inside one call is computed once.

Only the thread that makes the model's calls uses it (request batches' one, the scheduler's model
thread), so it takes no lock.
"""

import collections
from typing import Callable

import torch

Key = tuple


def key_of(token_ids: list[int], type_ids: list[int] | None, adapter: int = 0) -> Key:
    return (tuple(token_ids), tuple(type_ids) if type_ids is not None else None, adapter)


class RowCache:
    """Output rows by the text they were computed for, within `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.rows: collections.OrderedDict[Key, torch.Tensor] = collections.OrderedDict()
        self.bytes = 0

    def rows_for(
        self,
        token_ids: list[list[int]],
        type_ids: list[list[int]] | None,
        compute: Callable[[list[list[int]], list[list[int]] | None, list[int] | None], list[torch.Tensor]],
        adapters: list[int] | None = None,
    ) -> tuple[list[torch.Tensor], int]:
        """Each text's rows, from the cache or computed (`compute(token_ids, type_ids, adapters)` over
        the distinct texts not cached; `adapters`: each text's adapter id, None where none is served);
        and how many texts were not computed (found, or repeated)."""
        keys = [
            key_of(ids, None if type_ids is None else type_ids[index], 0 if adapters is None else adapters[index])
            for index, ids in enumerate(token_ids)
        ]
        found = {key: self.rows[key] for key in dict.fromkeys(keys) if key in self.rows}
        for key in found:  # used now: the last to go when the new rows make room
            self.rows.move_to_end(key)
        missing = [key for key in dict.fromkeys(keys) if key not in found]
        if missing:
            types = None if type_ids is None else [list(key[1]) for key in missing]
            chosen = None if adapters is None else [key[2] for key in missing]
            for key, row in zip(missing, compute([list(key[0]) for key in missing], types, chosen), strict=True):
                found[key] = row
                self.keep(key, row)
        return [found[key] for key in keys], len(keys) - len(missing)

    def keep(self, key: Key, row: torch.Tensor) -> None:
        """A copy of `row` (a row is a view of its whole call's output, which it would keep alive),
        older rows dropped to make room; a row larger than the whole bound is not kept."""
        size = row.numel() * row.element_size()
        if size > self.max_bytes:
            return
        self.rows[key] = row.clone()
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self.rows.popitem(last=False)
            self.bytes -= dropped.numel() * dropped.element_size()
