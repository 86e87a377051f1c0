"""The pipeline: the one core batch loads, ``FeatureStore.write``, the stream and HTTP
ingest share (``run``: source -> validate -> transform -> sinks, with exact counts)."""
