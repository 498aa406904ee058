"""The kernels' tools: benchmark, serving benchmark, autotuner, their results and notes.

Outside the fingerprint: nothing here can change what a kernel computes or how fast it
runs, so ``kernels.build.source_digests`` and a version's code snapshot
(``lineage.model.snapshot_files``) leave this package out. What the autotuner writes
that does change dispatch (``kernels/gpu_table.json``) lives in ``kernels`` itself.
Commands: ``python -m kernels.tools.bench``, ``python -m kernels.tools.autotune``.
"""
