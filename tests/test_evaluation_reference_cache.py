"""The float64 reference computed where it is cheap, sampled for long cases, and cached
as evidence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evaluation import reference_cache as rc
from evaluation.accuracy import evaluate_accuracy
from evaluation.cases import make_case
from kernels import get_attention_fn
from kernels.reference import attention_reference, attention_reference_jax, relative_error


def _case(rng, *, batch=2, q_len=96, kv_len=160, heads=4, kv_heads=2, head_dim=32,
          causal=True, lengths=True, case_id="heldout/hard/x"):
    q = rng.standard_normal((batch, q_len, heads, head_dim)).astype(np.float32)
    k = rng.standard_normal((batch, kv_len, kv_heads, head_dim)).astype(np.float32)
    v = rng.standard_normal((batch, kv_len, kv_heads, head_dim)).astype(np.float32)
    extra = dict(q_lengths=[q_len, q_len // 3], kv_lengths=[kv_len, 7]) if lengths else {}
    return make_case(case_id=case_id, category="hard", tags=("gqa",), q=q, k=k, v=v,
                     causal=causal, source="seed:test", **extra)


@pytest.mark.parametrize("causal", [False, True])
def test_jax_reference_equals_numpy_reference_to_float64_rounding(causal):
    """Same formula, two engines: GQA, padding (a batch row that sees no key at all)
    and a row sample spanning two blocks of the JAX version."""
    rng = np.random.default_rng()
    case = _case(rng, causal=causal)
    args = dict(causal=causal, q_lengths=case.q_lengths, kv_lengths=[case.k.shape[1], 0])
    full_np = attention_reference(case.q, case.k, case.v, **args)
    full_jax = attention_reference_jax(case.q, case.k, case.v, **args)
    assert full_jax.dtype == np.float64
    assert relative_error(full_jax, full_np) < 1e-13
    assert np.all(full_jax[1] == 0)  # kv_length 0: nothing to attend to
    rows = np.array([0, 1, 50, 95])
    sampled = attention_reference_jax(case.q, case.k, case.v, rows=rows, **args)
    assert relative_error(sampled, full_np[:, rows]) < 1e-13


def test_sample_rows_covers_both_ends_and_only_long_cases():
    assert rc.sample_rows(4096, 4096) is None
    rows = rc.sample_rows(8192, 8192)
    assert len(rows) == rc.SAMPLE_ROWS and np.all(np.diff(rows) > 0)
    assert {0, 15, 8176, 8191} <= set(rows.tolist())
    assert rows.max() < 8192


def test_cache_reuses_by_digest_and_a_changed_case_misses(tmp_path):
    rng = np.random.default_rng()
    case = _case(rng)
    cache = rc.ReferenceCache(tmp_path, method="numpy-float64")
    first, rows = cache(case)
    again, _ = rc.ReferenceCache(tmp_path, method="numpy-float64")(case)
    assert rows is None and np.array_equal(first, again)
    exact = attention_reference(case.q, case.k, case.v, causal=True, q_lengths=case.q_lengths,
                                kv_lengths=case.kv_lengths)
    assert np.array_equal(first, exact)
    second = rc.ReferenceCache(tmp_path, method="numpy-float64")
    second(case)
    other = _case(rng)  # fresh arrays: another digest, never served the first's reference
    second(other)
    assert [e.hit for e in second.index.entries] == [True, False]
    assert len(list(tmp_path.glob("*.npy"))) == 2


def test_long_case_is_scored_on_sampled_rows_and_still_catches_a_wrong_row(tmp_path):
    """A kernel wrong on one sampled row fails; the index names the rows used."""
    rng = np.random.default_rng()
    case = _case(rng, batch=1, q_len=640, kv_len=640, lengths=False, causal=True)
    cache = rc.ReferenceCache(tmp_path, method="numpy-float64", sample_above=1000)
    rows = rc.sample_rows(640, 640, above=1000)
    bad_row = int(rows[20])

    naive = get_attention_fn("naive")

    def wrong_on_one_row(q, k, v, **kw):
        out = naive(q, k, v, **kw)
        return out.at[:, bad_row].multiply(1.5)

    result = evaluate_accuracy([case], {"baseline": naive, "bad": wrong_on_one_row},
                               reference=cache)
    assert result["baseline"].cases[0].rel_error < 1e-5
    assert result["bad"].cases[0].rel_error > 1e-2
    assert cache.index.entries[0].rows == rows.tolist()
    assert cache.summary().sampled_cases == [case.spec.case_id]


def test_recheck_finds_a_tampered_cached_array(tmp_path):
    rng = np.random.default_rng()
    case = _case(rng)
    cache = rc.ReferenceCache(tmp_path, method="numpy-float64")
    cache(case)
    index_path = cache.write_index(tmp_path / rc.INDEX_FILE)
    index = rc.ReferenceIndex.model_validate(json.loads(index_path.read_text()))
    cases = {case.spec.case_id: case}
    clean = rc.recheck(index, cases)
    assert clean.checked == 1 and not clean.problems and clean.max_rel_diff < 1e-13

    entry = index.entries[0]
    path = tmp_path / f"{entry.key}.npy"
    array = np.load(path)
    array[0, 0, 0, 0] += 1.0
    np.save(path, array)
    assert "differs from the signed index" in rc.recheck(index, cases).problems[0]

    # A forger who also rewrites the index's sha256 is caught by the recomputation.
    forged = index.model_copy(deep=True)
    import hashlib
    forged.entries[0].sha256 = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
    problems = rc.recheck(forged, cases).problems
    assert problems and "differs from a recomputation" in problems[0]


def test_precompiling_in_threads_changes_no_result():
    """The accelerator host compiles the test set's shapes concurrently first; the
    scores must be the ones of the plain loop."""
    rng = np.random.default_rng()
    cases = [_case(rng, case_id=f"heldout/hard/c{i}", q_len=n, kv_len=n + 8)
             for i, n in enumerate((16, 40, 72))]
    impls = {"baseline": get_attention_fn("naive"), "candidate": get_attention_fn("xla")}
    plain = evaluate_accuracy(cases, impls)
    threaded = evaluate_accuracy(cases, impls, compile_workers=3)
    for role in impls:
        assert [r.rel_error for r in threaded[role].cases] == [r.rel_error for r in plain[role].cases]
        assert all(r.error is None and r.rel_error < 1e-5 for r in threaded[role].cases)


def test_recheck_takes_the_most_expensive_one_of_each_method_then_random_ones():
    """The costliest entry first (long cases are where a planted reference hides best),
    the costliest of each other method, then a random draw of the rest: every entry is
    drawn by some seed, so none is safe to forge."""
    def entry(i, method, seconds):
        return rc.CacheEntry(case_id=f"c{i}", case_digest="d", method=method, key=f"k{i}",
                             sha256="s", rows=None, hit=False, seconds=seconds)
    entries = [entry(0, "numpy-float64", 0.01), entry(1, "numpy-float64", 0.02),
               entry(2, "jax-gpu-float64", 0.5), entry(3, "jax-gpu-float64", 0.3),
               entry(4, "numpy-float64", 0.05)]
    assert [e.case_id for e in rc._sample(entries, 1)] == ["c2"]
    assert [e.case_id for e in rc._sample(entries, 2)] == ["c2", "c4"]
    drawn = set()
    for seed in range(40):
        picked = [e.case_id for e in rc._sample(entries, 3, np.random.default_rng(seed))]
        assert picked[:2] == ["c2", "c4"] and len(set(picked)) == 3
        drawn.add(picked[2])
    assert drawn == {"c0", "c1", "c3"}  # the third is random among the rest


class _KeySeal:
    """A stand-in seal (an HMAC with a key the forger does not have), so the cache's own
    rule is tested apart from the pipeline's Ed25519 seal (tests/test_lineage_reference_seal.py)."""

    def __init__(self, secret: bytes):
        self.secret = secret

    def _mac(self, entry) -> bytes:
        import hmac

        return hmac.new(self.secret, f"{entry.key}:{entry.sha256}".encode(), "sha256").digest()

    def seal(self, entry) -> bytes:
        return self._mac(entry)

    def opens(self, data, entry) -> bool:
        import hmac

        return hmac.compare_digest(data, self._mac(entry))


def test_a_planted_reference_is_recomputed_not_used(tmp_path):
    """A cached array rewritten by someone with the folder but not the key (the
    reference x 1.02, its seal copied or forged with another key): the next evaluation
    recomputes it, says why, and scores against the true float64 reference."""
    rng = np.random.default_rng()
    case = _case(rng)
    seal = _KeySeal(b"pipeline")
    truth, _ = rc.ReferenceCache(tmp_path, method="numpy-float64", seal=seal)(case)
    (npy,) = tmp_path.glob("*.npy")
    assert npy.with_suffix(".dsse.json").exists()
    again = rc.ReferenceCache(tmp_path, method="numpy-float64", seal=seal)
    assert np.array_equal(again(case)[0], truth) and again.index.entries[0].hit

    np.save(npy, truth * 1.02)  # planted; the old seal no longer matches these bytes
    fresh = rc.ReferenceCache(tmp_path, method="numpy-float64", seal=seal)
    got, _ = fresh(case)
    assert np.array_equal(got, truth)
    (entry,) = fresh.index.entries
    assert not entry.hit and "does not open" in entry.recomputed

    np.save(npy, truth * 1.02)  # planted with a seal made by another key
    forger = _KeySeal(b"forger")
    planted = rc.ReferenceCache(tmp_path, method="numpy-float64")._entry(
        case, "numpy-float64", entry.key, None, truth * 1.02)
    npy.with_suffix(".dsse.json").write_bytes(forger.seal(planted))
    assert np.array_equal(rc.ReferenceCache(tmp_path, method="numpy-float64",
                                            seal=seal)(case)[0], truth)

    np.save(npy, truth * 1.02)  # and with the seal deleted
    npy.with_suffix(".dsse.json").unlink()
    last = rc.ReferenceCache(tmp_path, method="numpy-float64", seal=seal)
    assert np.array_equal(last(case)[0], truth)
    assert last.index.entries[0].recomputed == "no seal beside the cached array"
    # without a seal (tools, the plain cache) the bytes are used as read: the seal decides
    np.save(npy, truth * 1.02)
    assert not np.array_equal(rc.ReferenceCache(tmp_path, method="numpy-float64")(case)[0],
                              truth)
