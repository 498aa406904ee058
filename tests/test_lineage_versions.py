"""A version is what serves: registered as an MLflow model that carries its own code.

v1 is registered from this checkout; v2 from a copy of the project whose kernel code
differs (the XLA kernel's output scaled by 1.5, a change no test set would miss). Both
load by ``models:/…`` and run *their own* code, side by side; a rollback to an older
version runs that version's code; ``mlflow models serve`` serves the production version.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import jax
import numpy as np
import pytest

import kernels
from evaluation.model import MiniLM
from flows.stack_config import free_port
from kernels.build import build as build_kernel
from kernels.shapes import AttentionShape
from lineage.aliases import registered_model, registry
from lineage.serving.version_runners import VersionPool, VersionWorker, endpoint
from lineage.serving.versions import (
    KERNEL_JSON,
    log_version_model,
    recorded_kernel,
    register_version,
)
from lineage.signing.sources import StoreSource
from lineage.store import tags
from lineage.store import tracking as tr
from tests.conftest_lineage import (
    build_chain,
    complete_chain,
    passing_metrics,
    promote,
    thresholds_yaml,
)

ROOT = Path(__file__).resolve().parents[1]
FAMILY = "versions-test"
SHAPE = AttentionShape(batch=1, q_len=64, kv_len=64, num_heads=2, num_kv_heads=2, head_dim=32,
                       dtype="float32")
TEXTS = ["Attention is a weighted average of values.", "The canary served five percent."]
INJECTED = "1.5 *"  # the change in the copy's kernels/xla.py

REGISTER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from evaluation.model import MiniLM
    from kernels.build import build as build_kernel
    from kernels.shapes import AttentionShape
    from lineage.signing import keys
    from lineage.store import tracking as tr
    from lineage.signing.attestations import Signing
    from lineage.serving.versions import log_version_model, register_version

    uri, root, family, out = sys.argv[1:5]
    tracking = tr.Tracking(tracking_uri=uri, artifact_root=root)
    signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key()),
                      trust=keys.folder_trust())
    shape = AttentionShape(batch=1, q_len=64, kv_len=64, num_heads=2, num_kv_heads=2,
                           head_dim=32, dtype="float32")
    build = build_kernel("xla", None, shape, platforms=(), output_dir=out)
    with tr.stage_run(tracking, family, "build") as run_id:
        logged = log_version_model(tracking, run_id, build, Path(out), MiniLM.load())
        version = register_version(tracking, family, run_id, build, logged, signing)
    print("VERSION", version, run_id)
""")


def _register_here(tracking, tmp_path: Path, signing) -> tuple[str, str]:
    out = tmp_path / "build-here"
    build = build_kernel("xla", None, SHAPE, platforms=(), output_dir=out)
    with tr.stage_run(tracking, FAMILY, "build") as run_id:
        logged = log_version_model(tracking, run_id, build, out, MiniLM.load())
        version = register_version(tracking, FAMILY, run_id, build, logged, signing)
    assert logged.files > 5 and logged.size_bytes > 10_000
    return run_id, version


def _register_from_changed_copy(tracking, tmp_path: Path) -> tuple[str, str]:
    copy = tmp_path / "copy"
    for package in ("kernels", "evaluation", "gates", "lineage"):
        shutil.copytree(ROOT / package, copy / package,
                        ignore=shutil.ignore_patterns("__pycache__", "bench_results"))
    xla = copy / "kernels" / "xla.py"
    source = xla.read_text()
    needle = '''    return _dot_product_attention(q, k, v, causal=causal, scale=scale, q_lengths=q_lengths,
                                  kv_lengths=kv_lengths, implementation="xla")'''
    assert needle in source
    xla.write_text(source.replace(needle, needle.replace("return _dot", f"return {INJECTED} _dot")))
    result = subprocess.run(
        [sys.executable, "-c", REGISTER, tracking.tracking_uri, tracking.artifact_root, FAMILY,
         str(tmp_path / "build-copy")],
        cwd=copy, capture_output=True, text=True, timeout=600,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr[-3000:]
    _, version, run_id = next(line for line in result.stdout.splitlines()
                              if line.startswith("VERSION")).split()
    return run_id, version


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """The session's pipeline signer (module-scoped tests cannot use the function fixture)."""
    from lineage.signing import keys
    from lineage.signing.attestations import Signing

    return Signing(signer=keys.load_signer(keys.ensure_pipeline_key()), trust=keys.folder_trust())


@pytest.fixture(scope="module")
def store(tmp_path_factory, signed):
    """v1 from this checkout, v2 from a copy with different kernel code."""
    tmp = tmp_path_factory.mktemp("versions")
    tracking = tr.local_tracking(tmp / "store")
    here = _register_here(tracking, tmp, signed)
    changed = _register_from_changed_copy(tracking, tmp)
    return tracking, tmp, {"here": here, "changed": changed}


def _source(tracking, signed):
    return StoreSource(tracking, FAMILY, signed.trust)


def test_each_version_records_its_code_and_the_copy_differs(store, signed):
    tracking, _, built = store
    here = recorded_kernel(_source(tracking, signed), built["here"][1])
    changed = recorded_kernel(_source(tracking, signed), built["changed"][1])
    assert here["implementation"] == changed["implementation"] == "xla"
    assert here["code_files"]["kernels/xla.py"] != changed["code_files"]["kernels/xla.py"]
    assert here["code_sha256"] != changed["code_sha256"]
    # the version's logged model holds the code it recorded, file by file
    files = tr.list_artifact_files(tracking, built["changed"][0])
    for name in ("kernels/xla.py", "kernels/api.py", "evaluation/model.py", "lineage/model.py"):
        assert f"model/code/{name}" in files
    data = tr.read_verified_artifact(tracking, built["changed"][0], "model/code/kernels/xla.py")
    assert INJECTED.encode() in data
    assert json.loads(tr.read_artifact(tracking, built["here"][0], KERNEL_JSON)) == here


def test_two_versions_with_different_code_run_side_by_side(store, signed):
    tracking, _, built = store
    v_here, v_changed = built["here"][1], built["changed"][1]
    with VersionPool(tracking, FAMILY, MiniLM.load(), signed.trust) as pool:
        here, changed = pool.runner(v_here), pool.runner(v_changed)
        assert not pool.in_own_process(v_here)  # byte-for-byte this checkout's code
        assert isinstance(changed, VersionWorker)
        assert changed.info["code_sha256"] == recorded_kernel(_source(tracking, signed),
                                                              v_changed)["code_sha256"]
        rng = np.random.default_rng(7)
        q, k, v = (rng.standard_normal((1, 40, 2, 32)).astype(np.float32) for _ in range(3))
        for _ in range(2):  # interleaved: both live at once, as in a canary
            ours = here(q, k, v, causal=True, scale=None)
            theirs = changed(q, k, v, causal=True, scale=None)
            np.testing.assert_allclose(theirs, 1.5 * ours, rtol=1e-5, atol=1e-6)
        reference = kernels.attention_reference(q, k, v, causal=True)
        assert kernels.relative_error(ours, reference) < 1e-5
        # Sentence embeddings go through the version's own encoder and kernel.
        e_here, _ = here.embed(TEXTS)
        e_changed, seconds = changed.embed(TEXTS)
        assert seconds > 0 and e_here.shape == e_changed.shape == (2, 384)
        assert not np.allclose(e_here, e_changed, atol=1e-3)


def test_the_same_code_loads_identically_in_its_own_process(store, signed):
    tracking, _, built = store
    run_id, version = built["here"]
    kernel = recorded_kernel(_source(tracking, signed), version)
    worker = VersionWorker(tracking, FAMILY, version, trust=signed.trust)
    assert worker.info["code_sha256"] == kernel["code_sha256"]
    try:
        pool = VersionPool(tracking, FAMILY, MiniLM.load(), signed.trust)
        in_process, _ = pool.runner(version).embed(TEXTS)
        in_worker, _ = worker.embed(TEXTS)
        np.testing.assert_allclose(in_worker, in_process, rtol=1e-5, atol=1e-6)
        assert worker.info["jax_drift"] is None
    finally:
        worker.close()


def test_a_worker_runs_minilm_in_the_contracts_attention_dtype(store, signed):
    """A version in its own process serves MiniLM with the attention dtype the pool's
    encoder has (the serving contract's model_dtype): a bf16 canary must not compare a
    bf16 candidate with a float32 production (both sides measured in one dtype)."""
    tracking, _, built = store
    _, version = built["here"]
    bf16 = MiniLM.load().with_attention_dtype("bfloat16")
    worker = VersionWorker(tracking, FAMILY, version, trust=signed.trust,
                           attention_dtype="bfloat16")
    try:
        assert worker.info["attention_dtype"] == "bfloat16"
        in_worker, _ = worker.embed(TEXTS)
        in_process, _ = VersionPool(tracking, FAMILY, bf16, signed.trust).runner(version).embed(TEXTS)
        f32, _ = VersionPool(tracking, FAMILY, MiniLM.load(), signed.trust).runner(version).embed(TEXTS)
        np.testing.assert_allclose(in_worker, in_process, rtol=1e-5, atol=1e-6)
        assert np.max(np.abs(in_worker - f32)) > 1e-4  # bf16 attention is visibly not f32
    finally:
        worker.close()


def _storage_location(tracking, version: str, value: str | None = None) -> str:
    import sqlite3

    db = tracking.tracking_uri.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        if value is not None:
            conn.execute("UPDATE model_versions SET storage_location = ? WHERE name = ? AND "
                         "version = ?", (value, registered_model.registered_model_name(FAMILY),
                                         int(version)))
        (found,) = conn.execute("SELECT storage_location FROM model_versions WHERE name = ? "
                                "AND version = ?", (registered_model.registered_model_name(FAMILY),
                                                    int(version))).fetchone()
    return found


def test_runners_refuse_files_that_are_not_the_signed_files(store, signed, tmp_path):
    """The version's storage location repointed at a doctored copy whose wrapper serves
    constant embeddings and reports the signed code digest: refused, naming the file."""
    from lineage.serving import model_files

    tracking, _, built = store
    version = built["here"][1]
    original = _storage_location(tracking, version)
    assert not model_files.check(tracking, _source(tracking, signed), version).problems
    import mlflow.artifacts

    doctored = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=original, dst_path=str(tmp_path / "doctored"),
        tracking_uri=tracking.tracking_uri))
    wrapper = doctored / "code" / "lineage" / "model.py"
    wrapper.write_text(wrapper.read_text().replace(
        "return self.encoder.embed(list(texts), attention_fn=self.attention_fn)",
        "return np.ones((len(texts), 384), np.float32)"))
    _storage_location(tracking, version, doctored.as_uri())
    try:
        found = model_files.check(tracking, _source(tracking, signed), version)
        assert found.problems == ["code/lineage/model.py: sha256 differs from the signed file "
                                  "manifest"], found
        with pytest.raises(RuntimeError, match="code/lineage/model.py"):
            VersionWorker(tracking, FAMILY, version, trust=signed.trust)
        with pytest.raises(RuntimeError, match="code/lineage/model.py"):
            VersionPool(tracking, FAMILY, None, signed.trust).runner(version)
    finally:
        _storage_location(tracking, version, original)


def test_rollback_runs_the_older_versions_code(store, tmp_path, signed):
    """v_changed is promoted first, then v_here; rolling back restores v_changed, and
    production then runs *its* code (1.5x), not the checkout's."""
    tracking, _, built = store
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml())
    for key in ("changed", "here"):
        chain = complete_chain(tracking, FAMILY, build_chain(
            tracking, FAMILY, path, passing_metrics(), built=built[key], signing=signed),
            signing=signed)
        promote(tracking, FAMILY, chain, signed)
    assert registered_model.alias_version(tracking, FAMILY, "production") == built["here"][1]
    registry.rollback(tracking, FAMILY, reason="test: back to the older code", signing=signed)
    assert registered_model.alias_version(tracking, FAMILY, "production") == built["changed"][1]
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 24, 2, 32)).astype(np.float32) for _ in range(3))
    with VersionPool(tracking, FAMILY, MiniLM.load(), signed.trust) as pool:
        production = endpoint(pool, "production")
        assert production.name == f"xla@v{built['changed'][1]}"
        out = production.runner(q, k, v, causal=False, scale=None)
    np.testing.assert_allclose(out, 1.5 * kernels.attention(q, k, v, implementation="xla"),
                               rtol=1e-5, atol=1e-6)


def test_the_version_page_has_a_signature_and_an_input_example(store):
    tracking, _, built = store
    mv = tracking.client().get_model_version(registered_model.registered_model_name(FAMILY),
                                             built["here"][1])
    assert mv.source == f"runs:/{built['here'][0]}/model"
    mlmodel = tr.read_verified_artifact(tracking, built["here"][0], "model/MLmodel").decode()
    assert "signature:" in mlmodel and "text" in mlmodel and "384" in mlmodel
    example = json.loads(tr.read_verified_artifact(tracking, built["here"][0],
                                                   "model/input_example.json"))
    assert example["columns"] == ["text"] and len(example["data"]) == 2
    requirements = tr.read_verified_artifact(tracking, built["here"][0],
                                             "model/requirements.txt").decode()
    assert f"jax=={jax.__version__}" in requirements


def test_mlflow_models_serve_embeds_with_the_production_version(store, signed):
    tracking, tmp, built = store
    version = registered_model.alias_version(tracking, FAMILY, "production") or built["here"][1]
    registry_uri = f"models:/{registered_model.registered_model_name(FAMILY)}/{version}"
    port = free_port()
    # As README says: with the virtual environment active (mlflow starts uvicorn from PATH).
    env = {**os.environ, "MLFLOW_TRACKING_URI": tracking.tracking_uri,
           "MLFLOW_REGISTRY_URI": tracking.tracking_uri,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", registry_uri,
         "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, server.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "mlflow models serve did not come up"
            time.sleep(1)
        body = json.dumps({"dataframe_split": {"columns": ["text"],
                                               "data": [[t] for t in TEXTS]}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            served = np.asarray(json.loads(response.read())["predictions"], np.float32)
    finally:
        server.terminate()
        server.wait(timeout=30)
    with VersionPool(tracking, FAMILY, MiniLM.load(), signed.trust) as pool:
        expected, _ = pool.runner(version).embed(TEXTS)
    assert served.shape == (2, 384)
    np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-5)
    assert tags.BUILD_RUN_ID in registered_model.version_tags(tracking, FAMILY, version)
