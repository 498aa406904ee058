"""MLflow tracking helpers and environment facts against a real SQLite store."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import jax
import pytest
from pydantic import BaseModel

from lineage.records.environment import collect_environment, git_revision
from lineage.store import tags
from lineage.store import tracking as tr


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    return tr.local_tracking(tmp_path_factory.mktemp("mlflow"))


def test_default_store_location(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    local = tr.default_tracking()
    assert local.tracking_uri == f"sqlite:///{tmp_path.resolve()}/.kernelgate/mlflow.db"
    assert local.artifact_root == (tmp_path.resolve() / ".kernelgate" / "mlartifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert tr.default_tracking() == tr.Tracking(tracking_uri="http://mlflow.internal:5000")


def test_artifacts_record_their_sha256(tracking, tmp_path):
    exports = tmp_path / "exports"
    (exports / "tpu").mkdir(parents=True)
    (exports / "tpu" / "attention.jax_export").write_bytes(b"\x01tpu-module")
    (exports / "cpu.jax_export").write_bytes(b"\x02cpu-module")
    with tr.stage_run(tracking, "fam", "build") as run_id:
        paths = tr.log_directory(tracking, run_id, exports, "build/exports")
        digest = tr.log_text(tracking, run_id, "héllo", "notes/readme.txt")
    assert paths == ["build/exports/cpu.jax_export", "build/exports/tpu/attention.jax_export"]
    recorded = tr.recorded_digests(tracking, run_id)
    assert recorded == {
        "build/exports/cpu.jax_export": hashlib.sha256(b"\x02cpu-module").hexdigest(),
        "build/exports/tpu/attention.jax_export": hashlib.sha256(b"\x01tpu-module").hexdigest(),
        "notes/readme.txt": hashlib.sha256("héllo".encode()).hexdigest(),
    }
    assert digest == recorded["notes/readme.txt"]
    assert tr.list_artifact_files(tracking, run_id) == sorted(recorded)
    assert tr.read_verified_artifact(tracking, run_id, "notes/readme.txt") == "héllo".encode()
    with pytest.raises(tr.ArtifactIntegrityError, match="no sha256 recorded"):
        tr.read_verified_artifact(tracking, run_id, "notes/other.txt")


@pytest.mark.parametrize("bad", ["/abs.json", "../up.json", "a/../b.json", "dir/", ""])
def test_bad_artifact_paths_are_rejected(tracking, bad):
    run_id = tr.start_run(tracking, "fam", "build")
    with pytest.raises(ValueError, match="artifact path"):
        tr.log_bytes(tracking, run_id, b"x", bad)


def test_dataset_inputs_params_and_environment_tags(tracking):
    class Blocks(BaseModel):
        block_q: int = 128
        block_kv: int = 64

    class Config(BaseModel):
        implementation: str = "pallas_tpu"
        blocks: Blocks = Blocks()

    facts = collect_environment()
    with tr.stage_run(tracking, "fam", "evaluation") as run_id:
        tr.log_dataset(
            tracking,
            run_id,
            name="kernelgate-testset",
            digest="3f2a9c" * 11,  # a 66-char digest: longer than MLflow's 36-char cap
            source_uri="file:///data/testset/heldout",
            context="heldout",
        )
        tr.log_params(tracking, run_id, Config())
        tr.set_tags(tracking, run_id, facts.as_tags())
    run = tracking.client().get_run(run_id)
    (inp,) = run.inputs.dataset_inputs
    assert inp.dataset.name == "kernelgate-testset"
    assert inp.dataset.digest == ("3f2a9c" * 11)[:32]
    input_tags = {t.key: t.value for t in inp.tags}
    assert input_tags["mlflow.data.context"] == "heldout"
    assert input_tags["kernelgate.sha256"] == "3f2a9c" * 11
    assert run.data.params == {
        "implementation": "pallas_tpu",
        "blocks.block_q": "128",
        "blocks.block_kv": "64",
    }
    assert run.data.tags[tags.ENV_PREFIX + "jax_version"] == jax.__version__
    assert run.data.tags[tags.ENV_PREFIX + "device_count"] == str(len(jax.devices()))
    assert run.data.tags[tags.ENV_PREFIX + "python_version"] == sys.version.split()[0]
    assert run.data.tags[tags.ENV_PREFIX + "platform"] == jax.default_backend()


def test_git_revision_and_dirty_flag(tmp_path):
    assert git_revision(tmp_path) == (None, None)

    def git(*args):
        return subprocess.run(
            ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "kernel.py").write_text("x = 1\n")
    git("add", "kernel.py")
    git("commit", "-q", "-m", "init")
    assert git_revision(tmp_path) == (git("rev-parse", "HEAD"), False)
    (tmp_path / "kernel.py").write_text("x = 2\n")
    assert git_revision(tmp_path) == (git("rev-parse", "HEAD"), True)


def test_family_names_are_checked():
    assert tr.experiment_name("pallas_tpu") == "kernelgate-pallas_tpu"
    with pytest.raises(ValueError, match="family"):
        tr.experiment_name("bad name/")


def test_tags_params_and_directory_digests_past_one_batch(tracking, tmp_path):
    """set_tags, log_params and log_directory write in log_batch chunks (MLflow takes 100
    tags or params a batch): every entry past a chunk boundary lands, with its own value."""
    import numpy as np

    rng = np.random.default_rng()
    many = tmp_path / "many"
    expected = {}
    for i in range(tr.BATCH_SIZE + 21):  # digests cross one batch boundary
        data = rng.bytes(int(rng.integers(1, 64)))
        (many / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (many / f"d{i % 3}" / f"f{i}.bin").write_bytes(data)
        expected[f"evidence/d{i % 3}/f{i}.bin"] = hashlib.sha256(data).hexdigest()
    values = {f"k{i}": f"v{i * 7}" for i in range(2 * tr.BATCH_SIZE + 50)}
    params = {f"p{i}": i * 3 for i in range(tr.BATCH_SIZE + 50)}
    with tr.stage_run(tracking, "fam", "evaluate") as run_id:
        tr.set_tags(tracking, run_id, values)
        tr.log_params(tracking, run_id, {"grid": params})
        paths = tr.log_directory(tracking, run_id, many, "evidence")
    run = tracking.client().get_run(run_id)
    assert {k: run.data.tags[k] for k in values} == values
    assert run.data.params == {f"grid.{k}": str(v) for k, v in params.items()}
    assert sorted(paths) == sorted(expected)
    assert tr.recorded_digests(tracking, run_id) == expected
    assert tr.list_artifact_files(tracking, run_id) == sorted(expected)
