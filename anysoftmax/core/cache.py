"""A bounded, thread-safe cache that builds each value once (compiled kernels, launch sizes)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

V = TypeVar("V")


class OnceCache(Generic[V]):
    """LRU cache of at most `maxsize` entries whose factory runs once per key, even across threads."""

    def __init__(self, maxsize: int = 256):
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._building: dict[Hashable, threading.Lock] = {}
        self._lock = threading.Lock()
        self.builds = 0  # how many times a factory ran (tests check "compiled once")

    def get(self, key: Hashable, factory: Callable[[], V]) -> V:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._data:
                    return self._data[key]
            value = factory()
            with self._lock:
                self.builds += 1
                self._data[key] = value
                while len(self._data) > self.maxsize:
                    self._data.popitem(last=False)
                self._building.pop(key, None)
            return value

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


class BoundedDict(Generic[V]):
    """A lock-free memo for hot paths: plain dict reads, at most `maxsize` entries, the oldest
    dropped first. Values must be cheap to recompute: two threads may both store the same key."""

    def __init__(self, maxsize: int = 1024):
        self.maxsize = maxsize
        self._data: dict = {}
        # The value of `key`, or None: the dict's own `get` (a hit path's lookup costs no Python call).
        self.get: Callable[[Hashable], V | None] = self._data.get

    def put(self, key: Hashable, value: V) -> None:
        while len(self._data) >= self.maxsize:
            try:
                del self._data[next(iter(self._data))]
            except (KeyError, StopIteration, RuntimeError):  # another thread evicted it first
                break
        self._data[key] = value

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()
