"""A store made by an earlier commit stays auditable, and its production version keeps
loading, after the code moves on.

Each ``tests/data/legacy-store-<commit>.tar.gz`` was made at that commit by
``tests/make_legacy_store.py`` (a rollout of ``xla``, family ``legacy``, promoted as v1)
in the folder :data:`LEGACY_STORES` names: ``store/`` (SQLite ``mlflow.db``, artifacts)
and ``keys/`` (the key folder that signed it). 1b29598 predates the family log; 1be416f
is the last commit before one plan per session (the registration's frozen bytes read
back by every stage), the kernels as classes with their own configs and the GPU table
of ``{implementation: config}``; a4ddf68 is the last commit before logs carried their
store's identity and canary plans could be sequential (its store has sealed float64
references, signed approval answers and aliases signed with their rollout run);
3aa28dc is the last commit before ``lineage/`` was split into subpackages by role (its
modules flat; its version, like every stored one, names ``lineage.model.KernelgateEncoder``,
which stays at that path).
``mlflow.db`` names its folder in absolute paths, so
each test works on an extraction of its own, relocated with ``tests.store_copies`` (which
checks that no path still names the folder it was made in — it may well exist here).

The version is not expected to be this checkout's code: the audit and the load below run
it from its logged model, in a process of its own where its code digest differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.store_copies import naming, relocate, tree_digest

LEGACY_STORES = {"1b29598": "/tmp/prev/out", "1be416f": "/tmp/prev1be/out",
                 "a4ddf68": "/tmp/prev-a4d/out", "3aa28dc": "/tmp/prev-3aa/out"}
"""The commit each store was made at -> the folder it was made in."""
BEFORE_THE_LOG = "1b29598"
BEFORE_STORE_IDENTITY = {"1be416f", "a4ddf68"}
"""Stores with a family log whose first entry names no store."""
FAMILY = "legacy"
ROOT = Path(__file__).resolve().parents[1]
KERNELGATE = Path(sys.executable).parent / "kernelgate"


def _tar(commit: str) -> Path:
    return Path(__file__).parent / "data" / f"legacy-store-{commit}.tar.gz"


TAR_SHA256 = {commit: hashlib.sha256(_tar(commit).read_bytes()).hexdigest()
              for commit in LEGACY_STORES}


def _extract(dest: Path, commit: str = BEFORE_THE_LOG) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(_tar(commit)) as tar:
        tar.extractall(dest, filter="data")
    relocate(dest / "store" / "mlflow.db", LEGACY_STORES[commit], str(dest.resolve()))
    return dest.resolve()


@pytest.fixture(scope="module", params=sorted(LEGACY_STORES))
def commit(request) -> str:
    """The commit whose store a test reads (every test runs on each)."""
    return request.param


@pytest.fixture(scope="module")
def legacy(tmp_path_factory, commit) -> Path:
    """One relocated extraction shared by the read-only tests of this module."""
    return _extract(tmp_path_factory.mktemp(f"legacy-{commit}"), commit)


def _env(store: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    uri = f"sqlite:///{store / 'mlflow.db'}"
    return {**env, "MLFLOW_TRACKING_URI": uri, "MLFLOW_REGISTRY_URI": uri,
            "PYTHONPATH": str(ROOT)}


def _kernelgate(legacy: Path, *args: str, cwd: Path | None = None,
                home: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in _env(legacy / "store").items() if not k.startswith("MLFLOW_")}
    env["KERNELGATE_KEY_DIR"] = str(legacy / "keys")
    if home is not None:  # the kernelgate home (the heads its audits remember)
        env["KERNELGATE_HOME"] = str(home)
    return subprocess.run([str(KERNELGATE), "audit", "production", "--family", FAMILY, *args],
                          cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_relocation_moves_every_stored_path(legacy, commit):
    db = legacy / "store" / "mlflow.db"
    made_in = LEGACY_STORES[commit]
    assert naming(db, made_in) == {}
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT run_uuid, artifact_uri FROM runs").fetchall()
        versions = conn.execute(
            "SELECT version, source, storage_location, run_id FROM model_versions "
            "WHERE name = ?", (f"kernelgate-{FAMILY}",)).fetchall()
    assert len(runs) >= 10  # a whole rollout: preregistration, build, evaluations, gates, ...
    for run_id, uri in runs:
        assert uri.startswith(f"file://{legacy}/store/mlartifacts/"), (run_id, uri)
        assert Path(uri.removeprefix("file://")).is_dir(), uri
    assert [v[0] for v in versions] == [1]
    run_ids = {r for r, _ in runs}
    for _, source, location, run_id in versions:
        assert made_in not in source and made_in not in location
        assert run_id in run_ids and source == f"runs:/{run_id}/model", source


@pytest.fixture(scope="module")
def audited(legacy, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """One ``kernelgate audit`` of the legacy production (the model loaded, the reference
    rechecked: the defaults) that also exports a bundle, in a kernelgate home of its own:
    ``(result, bundle, home)``. An audit process is most of this module's time, and the
    export is written after the same audit (``flows.cli.audit``), so the audit test and
    the bundle test share one instead of running two (the bundle test works on a copy)."""
    work = tmp_path_factory.mktemp("audited")
    bundle, home = work / "bundle", work / "home"
    home.mkdir()
    result = _kernelgate(legacy, "--store-dir", str(legacy / "store"), "--key-dir",
                         str(legacy / "keys"), "--export", str(bundle), home=home)
    return result, bundle, home


def test_audit_of_the_legacy_production_passes(audited, commit):
    result, _, _ = audited
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "AUDIT PASSED: kernelgate-legacy production -> v1" in out
    assert "[ok] loaded model: 1  loaded in" in out, out
    before_the_log = "WARNING: signed log of legacy:" in out and "before the log existed" in out
    assert before_the_log == (commit == BEFORE_THE_LOG), out
    # a log whose first entry names no store: verified, and said (not a failure)
    unbound = "made before logs carried a store identity" in out
    assert unbound == (commit in BEFORE_STORE_IDENTITY), out


def test_the_log_starts_after_the_legacy_prefix(tmp_path):
    """A new entry on a store made before the log existed is entry 1 of the family's log;
    the old records stay a legacy prefix (a warning), and the audit still passes."""
    from lineage.aliases import registry
    from lineage.audit.audit import audit
    from lineage.log import family_log
    from lineage.signing import keys
    from lineage.signing.attestations import Signing
    from lineage.signing.sources import StoreSource
    from lineage.store import tracking as tr

    root = _extract(tmp_path / "x")
    folder = root / "keys"
    signing = Signing(signer=keys.load_signer(keys.ensure_pipeline_key(folder)),
                      trust=keys.folder_trust(folder), key_dir=folder)
    tracking = tr.local_tracking(root / "store")
    before = family_log.read(StoreSource(tracking, FAMILY, signing.trust))
    assert before.entries == {} and before.legacy >= 10 and before.problems == []
    registry.clear_stale(tracking, FAMILY, "shadow", reason="test", signing=signing)
    registry.assign_shadow(tracking, FAMILY, "1", signing=signing)
    after = family_log.read(StoreSource(tracking, FAMILY, signing.trust))
    assert sorted(after.entries) == [1] and after.problems == [] and after.legacy == before.legacy
    report = audit(tracking, FAMILY, "production", trust=signing.trust, load_model=False)
    assert report.exit_code == 0, report.render()
    assert any("before the log existed" in w for w in report.warnings)


LOAD_SCRIPT = textwrap.dedent("""
    import json, sys
    import mlflow.pyfunc, numpy as np, pandas as pd
    model = mlflow.pyfunc.load_model("models:/kernelgate-legacy@production")
    texts = ["The kernel passed its gate and was promoted.",
             "Bananas are rich in potassium and grow in bunches."]
    emb = np.asarray(model.predict(pd.DataFrame({"text": texts})))
    encoder = model.unwrap_python_model()
    from kernels.reference import attention_reference  # the version's own snapshot

    def float64(q, k, v, *, causal=False, scale=None, q_lengths=None, kv_lengths=None):
        out = attention_reference(np.asarray(q), np.asarray(k), np.asarray(v), causal=causal,
                                  scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths)
        return out.astype(np.asarray(q).dtype)

    ref = np.asarray(encoder.encoder.embed(texts, attention_fn=float64, jit=False), np.float64)
    import kernels
    print(json.dumps({"shape": list(emb.shape), "dtype": str(emb.dtype),
                      "finite": bool(np.isfinite(emb).all()),
                      "norms": np.linalg.norm(emb.astype(np.float64), axis=1).tolist(),
                      "cos_vs_float64": (np.sum(emb * ref, axis=1)
                                         / np.linalg.norm(emb, axis=1)
                                         / np.linalg.norm(ref, axis=1)).tolist(),
                      "cos_between": float(emb[0] @ emb[1]),
                      "implementation": encoder.describe()["implementation"],
                      "code_sha256": encoder.describe()["code_sha256"],
                      "kernels_from": kernels.__file__}))
""")


def test_the_legacy_production_version_loads_and_embeds(legacy, tmp_path):
    store = legacy / "store"
    env = {k: v for k, v in _env(store).items() if k != "PYTHONPATH"}  # a consumer elsewhere
    result = subprocess.run([sys.executable, "-P", "-c", LOAD_SCRIPT], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["shape"] == [2, 384] and got["dtype"] == "float32" and got["finite"]
    assert all(abs(n - 1) < 1e-4 for n in got["norms"]), got["norms"]
    assert min(got["cos_vs_float64"]) > 0.9999, got["cos_vs_float64"]
    assert got["cos_between"] < 0.9, "two unrelated sentences embed (nearly) alike"
    assert got["implementation"] == "xla"
    snapshot = Path(got["kernels_from"])  # the version's logged code, not a checkout's
    assert snapshot.parts[-3:] == ("code", "kernels", "__init__.py"), snapshot
    assert not snapshot.is_relative_to(ROOT), snapshot
    with sqlite3.connect(store / "mlflow.db") as conn:
        (build_run,) = conn.execute("SELECT run_id FROM model_versions WHERE version = 1").fetchone()
        (signed,) = conn.execute("SELECT value FROM tags WHERE run_uuid = ? AND key = ?",
                                 (build_run, "kernelgate.code_sha256")).fetchone()
    assert got["code_sha256"] == signed


def test_an_exported_bundle_of_the_legacy_store_re_audits_offline(legacy, audited, tmp_path):
    exported, exported_to, exported_home = audited
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert f"bundle written to {exported_to}" in exported.stdout
    bundle, home = tmp_path / "bundle", tmp_path / "home"  # this test alters them: copies
    shutil.copytree(exported_to, bundle)
    shutil.copytree(exported_home, home)
    assert (bundle / "store_view.json").is_file() and (bundle / "VERIFY.md").is_file()
    offline = ["--bundle", ".", "--trusted-key", "keys/pipeline.pub.json"]
    again = _kernelgate(legacy, *offline, cwd=bundle, home=home)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "AUDIT PASSED" in again.stdout
    decision = next(bundle.glob("artifacts/*/decisions/gate_decision.json"))
    decision.write_bytes(decision.read_bytes() + b" ")
    tampered = _kernelgate(legacy, *offline, cwd=bundle, home=home)
    assert tampered.returncode == 1, tampered.stdout
    assert "decisions/gate_decision.json' of run" in tampered.stdout
    assert "differs from its signed digest" in tampered.stdout


def test_each_extraction_is_its_own_store(tmp_path, commit):
    from lineage.store import tracking as tr

    first, second = _extract(tmp_path / "first", commit), _extract(tmp_path / "second", commit)
    untouched = tree_digest(second)
    tracking = tr.local_tracking(first / "store")
    client = tracking.client()
    (run_id,) = [r.info.run_id for r in client.search_runs(
        [client.get_experiment_by_name(f"kernelgate-{FAMILY}").experiment_id],
        filter_string="tags.`kernelgate.stage` = 'build'")]
    name = f"touched-{uuid.uuid4().hex}.txt"
    client.log_text(run_id, "written to the first copy", name)
    client.set_model_version_tag(f"kernelgate-{FAMILY}", "1", "kernelgate.test.touched", "yes")
    written = list((first / "store" / "mlartifacts").rglob(name))
    assert len(written) == 1, "the artifact did not land in the copy it was written to"
    made_in = Path(LEGACY_STORES[commit])
    if made_in.is_dir():  # the folder the store was made in, where it may exist
        assert not list(made_in.rglob(name))
    assert tree_digest(second) == untouched
    assert hashlib.sha256(_tar(commit).read_bytes()).hexdigest() == TAR_SHA256[commit]
