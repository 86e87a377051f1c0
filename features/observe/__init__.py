"""What every layer reports through: log lines (:mod:`~features.observe.logs`), Prometheus
metrics (:mod:`~features.observe.metrics`) and progress lines
(:mod:`~features.observe.progress`). The bottom of the package's layers (docs/architecture.md
once it lands, issue 46): these modules import nothing of featureline but ``errors`` and
``config``-level base modules, so any stage may import them.
"""
