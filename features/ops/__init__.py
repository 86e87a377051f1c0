"""Running featureline: the local development services (:mod:`~features.ops.dev`),
``features health``, ``features init``, ``features demo`` and its example data
(:mod:`~features.ops.examples`), ``features migrate`` and ``features recompute``. These
drive the stages below them (sdk, pipeline, sinks); nothing below imports them (issue 46).
"""
