"""``features serve``: the HTTP ingest service (``docs/ingest.md``).

``POST /v1/schemas/{name}/events`` takes one JSON object, a JSON array of objects or
NDJSON; each record's bytes go through the stream job's own decode + validate +
transform (:func:`features.pipeline.prepare.prepare_records`), so a record the stream would
reject is refused here with the same rule and message. Rejects go to the rejects table
and the dead-letter topic first; then the valid records, byte for byte as sent, are
produced to the schema's Kafka topic (keyed by entity, idempotent producer,
``acks=all``) and the response waits for the broker's acknowledgement. The stream job
then stores them: Kafka stays the one write path.

- :mod:`features.serve.body`: a request body -> the records' exact bytes;
- :mod:`features.serve.ingest`: one schema's prepare step and rejects writer;
- :mod:`features.serve.producer`: the asyncio-facing Kafka producer;
- :mod:`features.serve.app`: the ASGI application (routes, auth, metrics, access log);
- :mod:`features.cli.serve`: the command, its worker processes and signals.
"""
