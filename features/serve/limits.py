"""What one ``features serve`` worker takes at most, by default (``docs/ingest.md``, Limits).

Each bounds memory that a client controls: a body's size alone does not (a 16 MiB
``[{},{},...]`` is 5.6 M records, each with an error per required field).
:mod:`features.cli.serve` offers each as a flag; :class:`features.serve.ingest.SchemaIngest`
and the producer apply them. Kept apart so that the command's parser imports no Arrow.
"""

from __future__ import annotations

#: Records one request may hold (``--max-records``); more: 413, the body not listed.
MAX_RECORDS = 50_000
#: Request rows one view request may hold (``--max-view-rows``); more: 413, nothing read.
#: It bounds a view request's work and answer: each row is a feature vector read from
#: every source (bench/serve_limits.py measures a worker's memory at this bound).
MAX_VIEW_ROWS = 1_000
#: Field errors one 422 response lists (``--max-errors``); the rest are only counted.
MAX_ERRORS = 1_000
#: Body bytes waiting to be checked, per worker and schema (``--max-queued-bytes``);
#: past it: 503 with Retry-After.
MAX_QUEUED_BYTES = 64 * 1024 * 1024
#: Connections plus requests one worker takes at once (``--limit-concurrency``, uvicorn's
#: ``limit_concurrency``; past it uvicorn answers 503). With the default body limit that
#: bounds the bodies a worker holds to 64 x 16 MiB.
LIMIT_CONCURRENCY = 64
