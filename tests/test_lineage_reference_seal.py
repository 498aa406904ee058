"""The pipeline's seal on a cached float64 reference: opens only for the pipeline's own
trusted key and exactly the bytes it sealed."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from evaluation.reference_cache import CacheEntry
from lineage.signing import keys
from lineage.signing.attestations import Signing
from lineage.signing.reference_seal import SignedReferences


def _signing(folder):
    keys.ensure_pipeline_key(folder)
    return Signing(signer=keys.load_signer(folder / "pipeline.pem"),
                   trust=keys.folder_trust(folder), key_dir=folder)


def _entry(array: np.ndarray, key: str = "a" * 64) -> CacheEntry:
    return CacheEntry(case_id="heldout/hard/x", case_digest="d" * 64, method="numpy-float64",
                      key=key, sha256=hashlib.sha256(array.tobytes()).hexdigest(), rows=None,
                      hit=False, seconds=0.1)


@pytest.fixture
def pipeline(tmp_path):
    return SignedReferences(_signing(tmp_path / "pipeline"))


def test_a_seal_opens_for_its_own_bytes_only(pipeline):
    array = np.random.default_rng().standard_normal((2, 8, 4, 16))
    entry = _entry(array)
    sealed = pipeline.seal(entry)
    assert pipeline.opens(sealed, entry)
    assert not pipeline.opens(sealed, _entry(array * 1.02))  # other bytes
    assert not pipeline.opens(sealed, _entry(array, key="b" * 64))  # another case's key
    assert not pipeline.opens(sealed.replace(b'"payload"', b'"payloaD"'), entry)
    assert not pipeline.opens(b"not an envelope", entry)


def test_a_seal_by_another_key_does_not_open(pipeline, tmp_path):
    array = np.random.default_rng().standard_normal((1, 4, 2, 8))
    forger = SignedReferences(_signing(tmp_path / "forger"))
    assert not pipeline.opens(forger.seal(_entry(array)), _entry(array))


def test_a_seal_by_a_revoked_key_does_not_open(tmp_path):
    folder = tmp_path / "keys"
    old = SignedReferences(_signing(folder))
    array = np.random.default_rng().standard_normal((1, 4, 2, 8))
    sealed = old.seal(_entry(array))
    old_keyid, _ = keys.rotate(folder)
    keys.revoke(old_keyid, folder, at=None)  # every signature of the old key void
    assert not SignedReferences(_signing(folder)).opens(sealed, _entry(array))
