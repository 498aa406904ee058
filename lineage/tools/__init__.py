"""Tools beside the package, as ``kernels/tools`` is beside the kernels: what the family
log and serving a version cost (``python -m lineage.tools.log_bench``, ``python -m
lineage.tools.versions_bench``) and a long-document comparison logged to MLflow
(``python -m lineage.tools.longdoc_log``). Nothing of the package imports them."""
