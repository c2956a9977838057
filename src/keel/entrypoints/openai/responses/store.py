"""Responses kept for `GET` / `DELETE` / cancel by id and for `previous_response_id`: in this process's memory only
(a replica's own; behind a router, chained requests need session affinity), bounded by total size and by age.

Each entry is self-contained: the whole conversation it answered (its previous responses' items included) and its
output, so evicting an old response never breaks a newer one that chained on it. Oldest entries go first when the
size bound is reached; entries older than the age bound are gone. A response is stored only when its request says
`store: true`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Stored:
    """A stored response: its body, the conversation items that continue it, and while it runs, how to cancel it."""

    body: dict[str, Any]  # the response object as the API returns it
    items: list[Any]  # input items + output items: the conversation a response chaining on this one continues
    size: int  # bytes it is counted as
    created_s: float = field(default_factory=time.monotonic)
    cancel: Callable[[], None] | None = None  # set while the response is in progress

    @property
    def in_progress(self) -> bool:
        return self.body.get("status") == "in_progress"


class ResponseStore:
    """At most `max_bytes` of responses (by their JSON size), none older than `max_age_s`."""

    def __init__(self, max_bytes: int, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if max_bytes < 0 or max_age_s <= 0:
            raise ValueError(f"ResponseStore: max_bytes >= 0 and max_age_s > 0 expected, got {max_bytes}, {max_age_s}")
        self.max_bytes, self.max_age_s, self.clock = max_bytes, max_age_s, clock
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self.bytes = 0
        self.evicted = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, entry: Stored) -> bool:
        """Keep `entry` (replacing one of the same id); False when it alone is larger than the store."""
        self._expire()
        self.delete(response_id)
        if entry.size > self.max_bytes:
            return False
        entry.created_s = self.clock()
        self._entries[response_id] = entry
        self.bytes += entry.size
        while self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.size
            self.evicted += 1
        return True

    def resize(self, response_id: str, size: int) -> None:
        """An entry's size changed (its output arrived); evict the oldest others if the store is now full."""
        entry = self._entries.get(response_id)
        if entry is None:
            return
        self.bytes += size - entry.size
        entry.size = size
        while self.bytes > self.max_bytes and len(self._entries) > 1:
            oldest = next(iter(self._entries))
            if oldest == response_id:
                self._entries.move_to_end(response_id)
                continue
            self.bytes -= self._entries.pop(oldest).size
            self.evicted += 1
        if self.bytes > self.max_bytes:
            self.delete(response_id)

    def entries(self) -> list[Stored]:
        self._expire()
        return list(self._entries.values())

    def get(self, response_id: str) -> Stored | None:
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True

    def _expire(self) -> None:
        horizon = self.clock() - self.max_age_s
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if oldest.created_s > horizon:
                return
            self.delete(oldest_id)
            self.evicted += 1
