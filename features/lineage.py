"""Where every stored or rejected row came from.

Every row written to a store carries the lineage columns below; rejects carry the
same plus their raw payload and errors. The source of one row is a URI:

- ``file:///abs/path/data.parquet#1234`` (0-based row within the file);
- ``kafka://topic/partition/offset``; for a record HTTP ingest produced (its
  ``featureline-source`` Kafka header) ``kafka://topic/partition/offset via
  http://<request id>#<index>``: the Kafka coordinates, then the request and position;
- ``python://<run id>#<row>`` (0-based row within the table) for a table or DataFrame
  written from Python with ``FeatureStore.write``, or ``python://<run id>/<source>#<row>``
  when the caller names the table (:func:`python_prefix`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SOURCE = "_source"
SCHEMA_NAME = "_schema_name"
SCHEMA_VERSION = "_schema_version"
SCHEMA_FINGERPRINT = "_schema_fingerprint"
RUN_ID = "_run_id"
INGESTED_AT = "_ingested_at"

#: Not lineage but stored beside it: the content digest of an event (16 hex digits,
#: ``features.kernels.digest``), a column of the history table (part of its key) and a
#: field of the entity's Redis hash; among events of one entity at one event time the
#: greatest digest is the newest. A static schema's row (``event_time: none``) carries it
#: too: of one load's rows of an entity, the greatest digest's is kept.
DIGEST = "_digest"

#: Lineage columns, in the order stores hold them.
LINEAGE_COLUMNS = (SOURCE, SCHEMA_NAME, SCHEMA_VERSION, SCHEMA_FINGERPRINT, RUN_ID, INGESTED_AT)


def new_run_id() -> str:
    """A fresh run id: UTC time for humans plus random bits for uniqueness."""
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def python_prefix(run_id: str, source: str | None = None) -> str:
    """The source URI prefix of the rows of one ``FeatureStore.write`` call (its rows are
    ``<prefix>#<row>``, :class:`BatchLineage`): ``python://<run id>``, or
    ``python://<run id>/<source>`` when the caller names the table."""
    return f"python://{run_id}" if source is None else f"python://{run_id}/{source}"


@dataclass(frozen=True)
class RunContext:
    """What every row of one run shares: schema identity, run id, ingestion time (UTC)."""

    schema_name: str
    schema_version: str
    fingerprint: str
    run_id: str
    ingested_at: dt.datetime

    def columns(self, sources: pa.Array) -> dict[str, pa.Array]:
        """The lineage columns for rows whose per-row source URIs are ``sources``."""
        n = len(sources)
        return {
            SOURCE: sources,
            SCHEMA_NAME: pa.repeat(pa.scalar(self.schema_name, pa.string()), n),
            SCHEMA_VERSION: pa.repeat(pa.scalar(self.schema_version, pa.string()), n),
            SCHEMA_FINGERPRINT: pa.repeat(pa.scalar(self.fingerprint, pa.string()), n),
            RUN_ID: pa.repeat(pa.scalar(self.run_id, pa.string()), n),
            INGESTED_AT: pa.repeat(pa.scalar(self.ingested_at, pa.timestamp("us", "UTC")), n),
        }


@dataclass(frozen=True)
class BatchLineage:
    """Lineage of one source batch: a URI prefix and how to name each row.

    For files, ``row_uris`` is ``prefix + "#" + (first_row + i)``; for Kafka the
    source gives explicit per-row URIs. ``unit`` names the batch for the commit ledger
    (stable across re-runs of the same input), or None when the source has no stable
    units (streams, which rely on idempotent upserts instead).
    """

    prefix: str
    first_row: int
    num_rows: int
    unit: str | None = None
    explicit: pa.Array | None = None
    #: the source row of each batch row when they are not consecutive (a batch filtered
    #: to one shard of the entities: ``features load --workers``); None: ``first_row + i``
    source_rows: pa.Int64Array | None = None
    #: names the batch's input content when its row URIs (and ``unit``) also name the run
    #: that reads it (a Python table's rows, ``python://<run id>#<row>``): ``@<table
    #: digest>/b<j>x<rows>``. Batches of one content hold the same rejects, which the
    #: rejects table keeps once. None: the row URIs name the input alone (files, Kafka).
    content: str | None = None

    def row_numbers(self, rows: pa.Array | None = None) -> pa.Array:
        """Source row numbers (0-based in the file) of ``rows`` (0-based within the batch;
        all rows when None)."""
        if self.source_rows is not None:
            return self.source_rows if rows is None else self.source_rows.take(rows)
        idx = pa.array(np.arange(self.num_rows, dtype=np.int64)) if rows is None else rows.cast(pa.int64())
        return pc.add(idx, self.first_row) if self.first_row else idx

    def row_uris(self, rows: pa.Array | None = None) -> pa.Array:
        """Source URIs for ``rows`` (0-based within the batch; all rows when None)."""
        if self.explicit is not None:
            return self.explicit if rows is None else self.explicit.take(rows)
        absolute = self.row_numbers(rows)
        return pc.binary_join_element_wise(self.prefix + "#", pc.cast(absolute, pa.string()), "")
