"""Make a small store with the code of the commit checked out: one promoted xla version.

Each ``tests/data/legacy-store-<commit>.tar.gz`` (read by
``tests/test_lineage_legacy_store.py``) was made with this script from a checkout of that
commit (1b29598 with OUT=/tmp/prev/out; 1be416f with OUT=/tmp/prev1be/out, a4ddf68
with OUT=/tmp/prev-a4d/out and 3aa28dc with OUT=/tmp/prev-3aa/out, whose
``store/jax-cache`` was left out too):

    KERNELGATE_KEY_DIR=OUT/keys PYTHONPATH=. python tests/make_legacy_store.py OUT
    cd OUT && tar czf legacy-store-<commit>.tar.gz --exclude=reference-cache \
        --exclude='store/runs/*.xplane.pb' --exclude=store/jax-cache store keys

It is a rollout of ``xla``, family ``legacy``, thresholds
``tests/data/thresholds-flow-test.yaml``, promoted as v1; the tar holds ``store/`` (the
MLflow SQLite store and its artifacts) and ``keys/`` (the key folder that signed it).
Left out: the float64 reference cache (a cache, rebuilt on demand; 51 MB) and the
profiler traces under ``store/runs/`` (local copies of logged artifacts). The profiler
trace logged as a signed artifact of the held-out evaluation stays in: an audit names a
signed artifact that is missing, so a tar without it would not audit clean.
"""

import os
import sys
from pathlib import Path

from prefect.testing.utilities import prefect_test_harness

from evaluation.testset import build_testset
from flows.rollout import rollout
from flows.settings import RolloutSettings
from kernels.shapes import AttentionShape

out = Path(sys.argv[1]).resolve()
out.mkdir(parents=True, exist_ok=True)
build_testset(out / "testset", profile="ci")
shape = AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                       head_dim=32, dtype="float32", causal=False)
settings = RolloutSettings(implementation="xla", family="legacy", thresholds=Path("tests/data/thresholds-flow-test.yaml"),
                           testset_dir=out / "testset", store_dir=out / "store", shadow_requests=8,
                           perf_repeats=3, perf_shapes=[shape], model_check=False)
os.environ.pop("MLFLOW_TRACKING_URI", None)
with prefect_test_harness(server_startup_timeout=120):
    outcome = rollout(settings)
print(outcome)
assert outcome.result == "promoted", outcome
