"""``PreparedRecords.entries``: the rejects' errors in their structured form (what the HTTP
answer lists) hold exactly what each reject row's ``errors`` JSON holds, on both decode
paths, decode rejects and a NUL character included."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest

from features.config import resolve_settings
from features.kernels import transform_program
from features.lineage import RunContext
from features.ops.examples import applicant_events, applicant_schema
from features.pipeline.prepare import prepare_records
from features.sources.columnar import ColumnarDecoder


@pytest.mark.parametrize("columnar", [True, False])
def test_entries_are_the_errors_of_each_reject_row(columnar: bool) -> None:
    compiled = applicant_schema()
    program = transform_program(compiled, resolve_settings())
    values = applicant_events(1500, invalid_share=0.2, undecodable_every=40)
    values += [b'{"application_id": "a\\u0000b", "income_monthly": "x\\u0000y"}', None, b"[1]"]
    now = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "r", now)
    offsets = np.arange(len(values), dtype=np.int64) + 1000
    max_bytes = compiled.schema.payload.max_bytes
    decoder = ColumnarDecoder(compiled.schema, max_bytes=max_bytes) if columnar else None
    part = prepare_records(values, pa.array([f"kafka://t/0/{o}" for o in offsets]), offsets, compiled,
                           program, ctx, now, decoder=decoder)
    rejects, entries = part.prepared.rejects, part.entries
    assert part.decode_rejects >= 2 and rejects.num_rows > part.decode_rejects  # both kinds are here
    from_json = [(group, e["field"], e["rule"], e["reason"], e["message"])
                 for group, text in enumerate(rejects.column("errors").to_pylist()) for e in json.loads(text)]
    # the errors JSON keeps a NUL character as the text \u0000 (jsonb refuses the escape)
    messages = [m.replace("\x00", "\\u0000") for m in entries.column("message").to_pylist()]
    structured = list(zip(entries.column("group").to_pylist(), entries.column("field").to_pylist(),
                          entries.column("rule").to_pylist(), entries.column("reason").to_pylist(), messages,
                          strict=True))
    assert structured == from_json
    # each entry's record is its reject row's (row_index: the record's offset)
    groups = entries.column("group").to_numpy()
    assert (offsets[entries.column("row").to_numpy()] == rejects.column("row_index").to_numpy()[groups]).all()
