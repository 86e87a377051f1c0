"""An in-memory ``Sink`` for testing the pipeline's wiring (``from memory_sink import MemorySink``).

STYLE: a tiny in-memory sink may test ``features/pipeline``, the way httpx's ``MockTransport``
tests a client; it never stands in for a store (the contract suite runs the real ones).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from features.errors import SinkError
from features.sinks.base import WriteResult, WriteUnit


class MemorySink:
    """Keeps each (entity, event time) once, the first write winning as in the stores, a
    commit ledger, and every :class:`WriteUnit` it was handed, in the order it got them.

    - ``fail_on``: the 1-based write call that raises :class:`SinkError` (store ``memory``)
      instead of writing (nothing of that unit is kept, as a rolled-back transaction);
    - ``delay_s``: each write sleeps this long first (a slow store);
    - ``gate``: each write waits for this event first (a store that hangs until released).
    """

    def __init__(self, name: str, entity: str, event_time: str, *, fail_on: int | None = None,
                 delay_s: float = 0.0, gate: threading.Event | None = None) -> None:
        self.name = name
        self.cols = (entity, event_time)
        #: (entity, event time) -> the stored row (lineage columns included)
        self.keys: dict[tuple[Any, Any], dict[str, Any]] = {}
        self.units: set[str] = set()
        self.rejects: list[dict[str, Any]] = []
        self.received: list[WriteUnit] = []
        self.fail_on = fail_on
        self.delay_s = delay_s
        self.gate = gate
        self.active = 0  # writes in progress now
        self._lock = threading.Lock()

    def open(self) -> None:
        pass

    def committed_units(self) -> set[str]:
        return set(self.units)

    def write(self, unit: WriteUnit) -> WriteResult:
        with self._lock:
            self.received.append(unit)
            call = len(self.received)
            self.active += 1
        try:
            if self.gate is not None:
                self.gate.wait(10)
            if self.delay_s:
                time.sleep(self.delay_s)
            if call == self.fail_on:
                raise SinkError(f"memory sink {self.name}: write {call} failed", store="memory")
            if unit.unit is not None and unit.unit in self.units:
                return WriteResult(skipped=True)
            new = 0
            for row in unit.rows.to_pylist():
                key = (row[self.cols[0]], row[self.cols[1]])
                if key not in self.keys:
                    self.keys[key] = row
                    new += 1
            self.rejects.extend(unit.rejects.to_pylist())
            if unit.unit is not None:
                self.units.add(unit.unit)
            return WriteResult(stored=new, already_present=unit.rows.num_rows - new,
                               rejects_stored=unit.rejects.num_rows, seconds=0.001)
        finally:
            with self._lock:
                self.active -= 1

    def close(self) -> None:
        pass
