"""Log lines on stderr, as text or as JSON objects, each with the run id.

Set up once per process at the edge: the CLI (``features --log-format text|json``,
every subcommand) and the stream job's Python workers (``FEATURES_LOG_FORMAT``, or the
format the CLI passes in the job's config). Library code only logs.

JSON lines carry ``ts`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``,
``message``, ``run_id`` and every field passed with ``extra=``::

    {"ts": "2024-05-01T12:00:00.123Z", "level": "INFO", "logger": "features.load",
     "message": "load finished", "run_id": "20240501T120000Z-1a2b3c4d", "read": 10000, ...}

Text lines read ``<time> <LEVEL> <logger> [<run id>]: <message>``, followed by the
extra fields as one JSON object when there are any. The run id is ``-`` until the
run is known (:func:`set_run_id`, :func:`bind_run_id`).
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from features.errors import ConfigError

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
#: The environment variable read when no format is given (the stream's Python workers).
ENV_VAR = "FEATURES_LOG_FORMAT"
#: The run id of lines logged before the run is known.
NO_RUN = "-"

_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("featureline_run_id", default=None)
#: Fallback for threads that do not inherit the context (sink threads, the HTTP server).
_process_run_id: str | None = None
_active: LogFormat | None = None

#: Attributes every LogRecord has: anything else on a record came from ``extra=``.
_RECORD_KEYS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "run_id", "taskName"}
_BASE_KEYS = ("ts", "level", "logger", "message", "run_id")


def set_run_id(run_id: str) -> None:
    """This process's run (every thread's lines carry it, unless :func:`bind_run_id` says
    otherwise in the current context)."""
    global _process_run_id
    _process_run_id = run_id


@contextlib.contextmanager
def bind_run_id(run_id: str) -> Iterator[None]:
    """Lines logged in this context (this thread, this task) carry ``run_id``."""
    token = _run_id.set(run_id)
    try:
        yield
    finally:
        _run_id.reset(token)


def current_run_id() -> str:
    return _run_id.get() or _process_run_id or NO_RUN


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a call passed with ``extra=`` (in the order given)."""
    return {k: v for k, v in vars(record).items() if k not in _RECORD_KEYS}


def fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` made safe for ``extra=``: a key LogRecord already has (``name``,
    ``msg``, ``args``, ...) gets a trailing underscore instead of raising KeyError."""
    return {(f"{k}_" if k in _RECORD_KEYS and k != "run_id" else k): v for k, v in values.items()}


class RunIdFilter(logging.Filter):
    """Puts ``run_id`` on every record (unless the call passed one with ``extra=``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "run_id", None):
            record.run_id = current_run_id()
        return True


def _ts(record: logging.LogRecord) -> str:
    moment = dt.datetime.fromtimestamp(record.created, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message``, ``run_id``,
    the ``extra=`` fields (one that clashes with those five gets a trailing underscore),
    and ``exc_info`` (the traceback text) when there is one. Values JSON cannot hold
    become their ``str()``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": _ts(record), "level": record.levelname, "logger": record.name,
                               "message": record.getMessage(),
                               "run_id": getattr(record, "run_id", None) or current_run_id()}
        for k, v in extra_fields(record).items():
            out[f"{k}_" if k in _BASE_KEYS else k] = v
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``<ISO time> <LEVEL> <logger> [<run id>]: <message> {extra fields as JSON}``."""

    def format(self, record: logging.LogRecord) -> str:
        run_id = getattr(record, "run_id", None) or current_run_id()
        line = f"{_ts(record)} {record.levelname} {record.name} [{run_id}]: {record.getMessage()}"
        extra = extra_fields(record)
        if extra:
            line += " " + json.dumps(extra, default=str, ensure_ascii=False)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time (a test's capture included)."""

    featureline = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging must never break the program; logging's own report
            self.handleError(record)


def resolve_format(fmt: str | None = None, *, environ: Mapping[str, str] | None = None) -> LogFormat:
    """``fmt``, else ``FEATURES_LOG_FORMAT``, else ``text``; ConfigError for another value."""
    env = os.environ if environ is None else environ
    value = fmt or env.get(ENV_VAR) or "text"
    if value not in FORMATS:
        where = "--log-format" if fmt else ENV_VAR
        raise ConfigError(f"invalid log format {value!r} ({where}): expected text or json", key="log_format",
                          looked_in=["--log-format", ENV_VAR])
    return value


def setup_logging(fmt: str | None = None, *, logger: str = "", level: int = logging.INFO) -> LogFormat:
    """Send log lines to stderr in ``fmt`` (see :func:`resolve_format`); returns the format.

    ``logger`` ``""`` (the root: the CLI) takes every library's lines too, so in JSON
    mode nothing else reaches stderr as plain text (Python warnings included);
    ``features`` loggers log at ``level``, the others at WARNING and above. Calling it
    again replaces the handler it installed (never two lines per record).
    """
    global _active
    chosen = resolve_format(fmt)
    target = logging.getLogger(logger)
    for h in list(target.handlers):
        if getattr(h, "featureline", False):
            target.removeHandler(h)
    handler = _StderrHandler()
    handler.addFilter(RunIdFilter())
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter())
    target.addHandler(handler)
    logging.getLogger("features").setLevel(level)
    if logger == "":
        target.setLevel(logging.WARNING)
        warnings.showwarning = _warning_line
    _active = chosen
    return chosen


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """A Python warning as one log line of logger ``features.warnings`` (``Category:
    message``), in the active format: not the library's file, line number and source line
    that ``warnings`` prints by default (:func:`setup_logging` installs it for the CLI)."""
    logging.getLogger("features.warnings").warning("%s: %s", category.__name__, message)


def active_format() -> LogFormat | None:
    """The format :func:`setup_logging` set in this process, or None when it was not called."""
    return _active


def has_handler(logger: str = "") -> bool:
    """Whether :func:`setup_logging` installed its handler on ``logger`` or the root."""
    names = {logger, ""}
    return any(getattr(h, "featureline", False) for n in names for h in logging.getLogger(n).handlers)


def user_message(text: str, *, level: int = logging.WARNING, logger: str = "features.cli",
                 **extra: Any) -> None:
    """A message for the person running the CLI (an error, a warning): printed to stderr
    as it is in text mode (or when logging is not set up), a log line in JSON mode."""
    if _active == "json":
        logging.getLogger(logger).log(level, text, extra=fields(extra))
    else:
        print(text, file=sys.stderr)


__all__ = ["ENV_VAR", "FORMATS", "NO_RUN", "JsonFormatter", "LogFormat", "RunIdFilter", "TextFormatter",
           "active_format", "bind_run_id", "current_run_id", "extra_fields", "fields", "has_handler",
           "resolve_format", "set_run_id", "setup_logging", "user_message"]
