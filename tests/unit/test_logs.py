"""features.observe.logs: JSON and text lines, the run id on every line, the CLI's --log-format."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from features.cli import build_parser, main
from features.errors import ConfigError
from features.observe import logs


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """setup_logging changes process-wide logging: undo it after each test."""
    root, feats = logging.getLogger(), logging.getLogger("features")
    saved = (list(root.handlers), root.level, list(feats.handlers), feats.level, logs._active,
             logs._process_run_id)
    shown = warnings.showwarning
    yield
    warnings.showwarning = shown
    root.handlers[:], root.level = saved[0], saved[1]
    feats.handlers[:], feats.level = saved[2], saved[3]
    logs._active, logs._process_run_id = saved[4], saved[5]
    logging.captureWarnings(False)


def lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line]


def test_json_lines_carry_ts_level_logger_message_run_id_and_extras(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert logs.setup_logging("json") == "json"
    log = logging.getLogger("features.test")
    log.info("before the run")
    logs.set_run_id("run-1")
    log.warning("counted %d rows", 5, extra=logs.fields({"rows": 5, "when": dt.date(2024, 1, 2),
                                                         "message": "clash", "level": "clash too"}))
    with logs.bind_run_id("run-2"):
        log.info("inside")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    out = [json.loads(line) for line in lines(capsys.readouterr().err)]
    assert [o["run_id"] for o in out] == ["-", "run-1", "run-2", "run-1"]
    first = out[1]
    assert list(first)[:5] == ["ts", "level", "logger", "message", "run_id"]
    assert first["level"] == "WARNING" and first["logger"] == "features.test"
    assert first["message"] == "counted 5 rows" and first["rows"] == 5 and first["when"] == "2024-01-02"
    # an extra field never overwrites the base ones
    assert first["message_"] == "clash" and first["level_"] == "clash too"
    assert dt.datetime.fromisoformat(first["ts"]).utcoffset() == dt.timedelta(0)
    assert first["ts"].endswith("Z")
    assert "ValueError: boom" in out[3]["exc_info"]


def test_threads_without_the_context_get_the_process_run_id(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup_logging("json")
    logs.set_run_id("run-p")
    with logs.bind_run_id("run-ctx"):
        t = threading.Thread(target=lambda: logging.getLogger("features.t").info("from a thread"))
        t.start()
        t.join()
    out = [json.loads(line) for line in lines(capsys.readouterr().err)]
    assert [o["run_id"] for o in out] == ["run-p"]


def test_text_lines_and_status_fields(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup_logging("text")
    logs.set_run_id("run-t")
    logging.getLogger("features.stream").info("stream", extra=logs.fields({"read": 3, "name": "x"}))
    (line,) = lines(capsys.readouterr().err)
    head, _, tail = line.partition(": stream ")
    assert head.endswith(" INFO features.stream [run-t]")
    assert json.loads(tail) == {"read": 3, "name_": "x"}


def test_setup_twice_keeps_one_handler_and_other_libraries_log_warnings_only(
        capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup_logging("text")
    logs.setup_logging("json")
    logging.getLogger("features.x").info("one line")
    logging.getLogger("somelib").info("not shown")
    logging.getLogger("somelib").warning("shown")
    out = [json.loads(line) for line in lines(capsys.readouterr().err)]
    assert [o["message"] for o in out] == ["one line", "shown"]


def test_format_from_environment_and_refusal() -> None:
    assert logs.resolve_format(None, environ={"FEATURES_LOG_FORMAT": "json"}) == "json"
    assert logs.resolve_format("text", environ={"FEATURES_LOG_FORMAT": "json"}) == "text"
    assert logs.resolve_format(None, environ={}) == "text"
    with pytest.raises(ConfigError) as err:
        logs.resolve_format(None, environ={"FEATURES_LOG_FORMAT": "xml"})
    assert err.value.key == "log_format" and "FEATURES_LOG_FORMAT" in str(err.value)


def test_log_format_goes_before_or_after_any_subcommand() -> None:
    parser = build_parser()
    assert parser.parse_args(["--log-format", "json", "load", "--schema", "s", "p"]).log_format == "json"
    assert parser.parse_args(["load", "--schema", "s", "p", "--log-format", "json"]).log_format == "json"
    assert parser.parse_args(["load", "--schema", "s", "p"]).log_format is None
    assert parser.parse_args(["dev", "status", "--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit):
        parser.parse_args(["load", "--schema", "s", "p", "--log-format", "xml"])


def test_cli_errors_are_json_lines_in_json_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["load", "--schema", "no_such_schema", "--schemas-dir", str(tmp_path), str(tmp_path / "x"),
                 "--log-format", "json"])
    assert code == 2
    (line,) = lines(capsys.readouterr().err)
    obj = json.loads(line)
    assert obj["level"] == "ERROR" and obj["error"] == "ConfigError" and obj["command"] == "load"
    assert obj["message"].startswith("features load: error: no schema named 'no_such_schema'")
    assert obj["run_id"] != ""
    code = main(["load", "--schema", "no_such_schema", "--schemas-dir", str(tmp_path), str(tmp_path / "x"),
                 "--log-format", "text"])
    assert code == 2
    assert capsys.readouterr().err.startswith("features load: error: no schema named")


@pytest.mark.parametrize(("given", "shown"), [(None, "clicks.rejects"), ("mine.dlq", "mine.dlq"), ("", None)])
def test_the_stream_start_line_shows_the_dead_letter_topic_it_writes_to(given: str | None,
                                                                         shown: str | None) -> None:
    """``stream: submitting`` logs the job's configuration: the dead-letter topic and the
    consumer group as the job resolves them (it said ``"dead_letter_topic": null`` while
    the job wrote to ``<topic>.rejects``); null only when dead letters are disabled."""
    from features.flink.stream import StreamConfig, default_group_id, redacted

    cfg = StreamConfig(schema_path="schemas/clicks.yaml", topic="clicks", bootstrap="k:9092",
                       postgres_dsn="postgresql://db/f", redis_url="redis://c:1/0", dead_letter_topic=given)
    line = logs.fields(redacted(cfg))
    assert line["dead_letter_topic"] == shown == cfg.dlq
    assert line["group_id"] == cfg.group == default_group_id("schemas/clicks.yaml", "clicks")
    assert json.loads(json.dumps(line))["topic"] == "clicks"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_python_warning_is_one_log_line(fmt: str) -> None:
    """issue 47: a library warning reached the terminal as Python prints it (``file:line:
    Category: message`` and the source line below); the CLI logs it as one line."""
    code = ("import warnings; from features.observe.logs import setup_logging; "
            f"setup_logging({fmt!r}); warnings.warn('ignoring column(s) x', UserWarning)")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr
    assert len(lines(err)) == 1, err
    assert "UserWarning: ignoring column(s) x" in err
    assert "warnings.warn(" not in err and "<string>" not in err
    if fmt == "json":
        assert json.loads(err)["logger"] == "features.warnings"
