"""A cache of technique results (CACHE_ENABLED): the same call on the same data is answered from memory.

The key is the technique, the call's arguments (normalized: validated, defaults filled in, keys sorted)
and the collection's data version, which every write to the collection moves on (from any process), so a
write invalidates every cached result of that collection without any bookkeeping. Entries also expire
after CACHE_TTL_SECONDS, and the least recently used go first past MAX_ENTRIES.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from typing import Any

import orjson

MAX_ENTRIES = 1024


def cache_key(technique: str, arguments: dict[str, Any], version: int) -> bytes:
    """The normalized call: the same arguments in any key order give the same key."""
    return orjson.dumps([technique, version, arguments], option=orjson.OPT_SORT_KEYS)


class ResultCache:
    """Thread-safe LRU with a time-to-live; results are copied in and out, so callers never share one."""

    def __init__(self, ttl_s: float, max_entries: int = MAX_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[float, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: bytes) -> tuple[dict[str, Any], float] | None:
        """(a copy of the result, its age in seconds), or None."""
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or now - entry[0] > self.ttl_s:
                if entry is not None:
                    del self._entries[key]
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            stored, result = entry
        return copy.deepcopy(result), now - stored

    def put(self, key: bytes, result: dict[str, Any]) -> None:
        """Keep a copy of the result."""
        kept = copy.deepcopy(result)
        with self._lock:
            self._entries[key] = (time.monotonic(), kept)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def stats(self) -> dict[str, Any]:
        """Entries, hits and misses (for health details)."""
        with self._lock:
            return {
                "entries": len(self._entries),
                "hits": self.hits,
                "misses": self.misses,
                "ttl_s": self.ttl_s,
            }
