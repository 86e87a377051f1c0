"""Every dead letter fits the size it is given (``features.sinks.dead_letter.dead_letter_messages``).

For any reject (a raw record and errors holding any text: quotes, backslashes, control
and multi-byte characters, many errors) and any limit from ``DEAD_LETTER_MIN_BYTES`` up,
each message is valid JSON whose key + value + the record overhead fit the limit; a
message that fits whole is sent whole, and one cut down says so, with the raw record's
canonical size and sha256 and a prefix of its text. The integration test
``tests/integration/test_dead_letter_size.py`` sends one to a real topic.
"""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from features.ops.examples import applicant_schema
from features.sinks.dead_letter import DEAD_LETTER_MIN_BYTES, canonical_json, dead_letter_messages

COMPILED = applicant_schema()
#: What a Kafka record batch of one record adds to its key and value (as the code assumes).
OVERHEAD = 1024

TEXT = st.text(st.characters(codec="utf-8"), max_size=30) | st.builds(
    lambda c, n: c * n, st.sampled_from(['"', "\\", "\x01", "\u00e9", "\U0001f600", "x"]),
    st.integers(0, 120_000))
ERROR = st.fixed_dictionaries({"field": TEXT, "rule": st.just("x.max_length"),
                               "reason": st.just("max_length"), "message": TEXT,
                               "value": TEXT | st.none() | st.integers()})


@settings(max_examples=60, deadline=None)
@given(raw=st.dictionaries(TEXT, TEXT | st.integers() | st.none(), max_size=4),
       errors=st.lists(ERROR, min_size=1, max_size=40),
       limit=st.integers(DEAD_LETTER_MIN_BYTES, 400_000))
def test_every_dead_letter_fits_its_limit(raw: dict[str, object], errors: list[dict[str, object]],
                                          limit: int) -> None:
    raw_text = json.dumps(raw, ensure_ascii=False)
    errs_text = json.dumps(errors, ensure_ascii=False)
    src = "kafka://applications/3/123456789"
    table = pa.table({"_source": [src], "raw": [raw_text], "errors": [errs_text]})
    [(key, value)] = dead_letter_messages(table, COMPILED, "run-1", max_message_bytes=limit)
    assert key == src.encode()
    assert len(key) + len(value) + OVERHEAD <= limit
    letter = json.loads(value)
    assert letter["source"] == src and letter["schema"] == COMPILED.name and letter["run_id"] == "run-1"
    [(_, whole_value)] = dead_letter_messages(table, COMPILED, "run-1", max_message_bytes=10**9)
    whole = json.loads(whole_value)
    if "truncated" not in letter:
        assert value == whole_value, "a message that fits is sent whole"
        assert letter["raw"] == raw and letter["errors"] == errors
        return
    # cut down only when the whole one does not fit
    assert len(key) + len(whole_value) + OVERHEAD > limit
    assert letter["truncated"] is True
    assert letter["full_bytes"] == len(whole_value)
    canonical = canonical_json(raw).encode()
    assert letter["raw_bytes"] == len(canonical)
    assert letter["raw_sha256"] == hashlib.sha256(canonical).hexdigest()
    prefix = letter["raw"]["_raw_prefix"]
    assert raw_text.startswith(prefix)
    # the prefix is no token: it is the whole text, or at least a seventh of the room the
    # rest of the message leaves it (a character's JSON literal is at most 7 bytes,
    # "\\u0001": the prefix is shrunk in proportion until it fits)
    literal = len(json.dumps(prefix, ensure_ascii=False).encode())
    room = limit - OVERHEAD - len(key) - len(value) + literal
    assert prefix == raw_text or len(prefix) >= room // 7, (room, len(prefix))
    assert {k: v for k, v in letter.items() if k not in ("errors", "raw", "truncated", "full_bytes",
                                                         "raw_bytes", "raw_sha256")} == \
        {k: v for k, v in whole.items() if k not in ("errors", "raw")}
    assert 0 < len(letter["errors"]) <= len(errors)
    for cut, full in zip(letter["errors"], errors, strict=False):
        for k, v in full.items():
            if isinstance(v, str) and cut[k] != v:
                assert cut[k].endswith("\u2026") and v.startswith(cut[k][:-1])
            else:
                assert cut[k] == v


def test_a_limit_under_the_minimum_is_refused() -> None:
    import pytest

    table = pa.table({"_source": ["kafka://t/0/1"], "raw": ["{}"], "errors": ["[]"]})
    with pytest.raises(ValueError, match="under"):
        dead_letter_messages(table, COMPILED, "run-1", max_message_bytes=DEAD_LETTER_MIN_BYTES - 1)
