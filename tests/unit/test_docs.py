"""Docs that quote code must quote it as it is."""

from __future__ import annotations

from pathlib import Path

from features.sinks.redis import NEWEST_WINS

ROOT = Path(__file__).resolve().parents[2]


def test_redis_doc_quotes_the_newest_wins_script_verbatim() -> None:
    assert NEWEST_WINS.strip() in (ROOT / "docs" / "redis.md").read_text()
