"""Progress lines on a terminal: the loader's, the stream's, the aggregation backfill's
and the report's (silent when stderr is not a TTY)."""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol


class RunSummary(Protocol):
    """What a run's progress line reads of the loader's summary
    (``features.pipeline.summary.RunSummary``; a Protocol: this bottom layer imports no stage)."""

    @property
    def schema(self) -> str: ...
    @property
    def read(self) -> int: ...
    @property
    def rejected(self) -> int: ...
    @property
    def stored(self) -> int: ...


class LineProgress:
    """A one-line progress display on a terminal (rows, rows/s, rejects so far, an optional
    tail); silent when the stream is not a TTY. The loader's, the stream's and the
    report's progress lines."""

    def __init__(self, label: str, total: int | None, *, enabled: bool, stream: Any = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self.last = 0.0

    def update(self, rows: int, rejected: int, *, force: bool = False, tail: str = "") -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last < 0.2:
            return
        self.last = now
        rate = rows / max(now - self.t0, 1e-9)
        done = f"{rows:,}"
        if self.total:
            done += f"/{self.total:,} ({min(100.0, 100 * rows / self.total):.0f}%)"
        self.stream.write(f"\r{self.label}: {done} rows  {rate:,.0f} rows/s  rejected {rejected:,}{tail}   ")
        self.stream.flush()

    def close(self, rows: int, rejected: int, *, tail: str = "") -> None:
        if self.enabled:
            self.update(rows, rejected, force=True, tail=tail)
            self.stream.write("\n")
            self.stream.flush()


class Progress:
    """The loader's progress line, fed with its :class:`RunSummary`."""

    def __init__(self, total: int | None, *, enabled: bool, stream: Any = None) -> None:
        self.line = LineProgress("", total, enabled=enabled, stream=stream)

    @property
    def enabled(self) -> bool:
        return self.line.enabled

    def update(self, s: RunSummary, *, force: bool = False) -> None:
        self.line.label = s.schema
        self.line.update(s.read, s.rejected, force=force, tail=f"  stored {s.stored:,}")

    def close(self, s: RunSummary) -> None:
        self.line.label = s.schema
        self.line.close(s.read, s.rejected, tail=f"  stored {s.stored:,}")


__all__ = ["LineProgress", "Progress"]
