"""Great Expectations validation of the test set: clean sets pass, corrupted ones stop."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from evaluation.testset import (
    load_manifest,
    load_split,
    set_digest,
    split_digest,
    write_manifest,
    write_split_arrays,
)
from evaluation.validation import TestSetValidationError, validate_testset
from tests.shared_builds import ci_testset


@pytest.fixture(scope="module")
def testset(tmp_path_factory):
    """The run's CI test set (read-only here: each corrupting test edits a copy)."""
    return ci_testset(tmp_path_factory)


def _copy(src, dst):
    shutil.copy(src / "manifest.json", dst / "manifest.json")
    shutil.copy(src / "heldout.npz", dst / "heldout.npz")
    return dst


def _replace_case(directory, case_id, **arrays):
    """Rewrite heldout.npz with some arrays of one case replaced (manifest untouched)."""
    cases = load_split(directory, "heldout")
    out = []
    for case in cases:
        if case.spec.case_id == case_id:
            case = type(case)(**{"spec": case.spec, "q": case.q, "k": case.k, "v": case.v,
                                 "q_lengths": case.q_lengths, "kv_lengths": case.kv_lengths,
                                 **arrays})
        out.append(case)
    write_split_arrays(directory / "heldout.npz", out)


def _f32_case(directory):
    return next(c for c in load_split(directory, "heldout") if c.spec.dtype == "float32")


def _failure_text(err: TestSetValidationError) -> str:
    return " | ".join(err.outcome.reasons())


def test_clean_testset_passes_and_writes_the_gx_result(testset, tmp_path):
    path = tmp_path / "validation.json"
    outcome = validate_testset(testset, "heldout", result_path=path)
    assert outcome.success and not outcome.failures
    assert outcome.n_expectations >= 30
    written = json.loads(path.read_text())
    assert written["success"] is True
    assert written["gx_result"]["case_summary"]["success"] is True
    assert written["testset_digest"] == load_manifest(testset).digest
    # the same results as GX Data Docs pages, one per validated table
    pages = sorted((tmp_path / "validation-data-docs").glob("*.html"))
    assert {p.stem for p in pages} == set(written["gx_result"])
    html = (tmp_path / "validation-data-docs" / "case_summary.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html")
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "Status: Succeeded" in text and "Unsuccessful Expectations 0" in text
    assert "case ids are unique" in text  # our suite's own descriptions, rendered


def test_injected_nan_fails_with_a_readable_reason(testset, tmp_path):
    d = _copy(testset, tmp_path)
    case = _f32_case(d)
    q = case.q.copy()
    q[0, 0, 0, 0] = np.nan
    _replace_case(d, case.spec.case_id, q=q)
    with pytest.raises(TestSetValidationError) as err:
        validate_testset(d, "heldout")
    text = _failure_text(err.value)
    assert "every q/k/v value is finite" in text and case.spec.case_id in text
    failed = {(f.table, f.expectation) for f in err.value.outcome.failures}
    # GX range checks skip NaN; the paired not-null checks must catch it.
    assert ("case_summary", "expect_column_values_to_not_be_null") in failed


def test_wrong_dtype_fails_with_a_readable_reason(testset, tmp_path):
    d = _copy(testset, tmp_path)
    case = _f32_case(d)
    _replace_case(d, case.spec.case_id, k=case.k.astype(np.float64))
    with pytest.raises(TestSetValidationError) as err:
        validate_testset(d, "heldout")
    text = _failure_text(err.value)
    assert "dtype equals the manifest's" in text and case.spec.case_id in text
    assert "k=float64" in text


def test_shape_mismatch_fails_with_a_readable_reason(testset, tmp_path):
    d = _copy(testset, tmp_path)
    case = _f32_case(d)
    _replace_case(d, case.spec.case_id, v=case.v[:, :-1])
    with pytest.raises(TestSetValidationError) as err:
        validate_testset(d, "heldout")
    text = _failure_text(err.value)
    assert "v shape equals the manifest's kv shape" in text and case.spec.case_id in text


def test_case_present_in_two_splits_fails(testset, tmp_path):
    d = _copy(testset, tmp_path)
    manifest = load_manifest(d)
    tuning_cases = load_split(testset, "tuning")
    leaked = tuning_cases[5]
    leaked_spec = leaked.spec.model_copy(update={"case_id": "heldout/hard/leaked-from-tuning"})
    heldout_cases = [*load_split(d, "heldout"),
                     type(leaked)(spec=leaked_spec, q=leaked.q, k=leaked.k, v=leaked.v,
                                  q_lengths=leaked.q_lengths, kv_lengths=leaked.kv_lengths)]
    write_split_arrays(d / "heldout.npz", heldout_cases)
    specs = [c.spec for c in heldout_cases]
    heldout = manifest.splits["heldout"].model_copy(update={"cases": specs,
                                                            "digest": split_digest(specs)})
    splits = {**manifest.splits, "heldout": heldout}
    write_manifest(d, manifest.model_copy(update={"splits": splits, "digest": set_digest(splits)}))
    outcome = validate_testset(d, "heldout", raise_on_failure=False)
    assert not outcome.success
    (failure,) = outcome.failures  # the arrays and manifest agree: only disjointness fails
    assert "split disjointness" in failure.reason
    assert set(failure.failing) == {leaked.spec.case_id, "heldout/hard/leaked-from-tuning"}


def test_category_below_minimum_fails(testset):
    with pytest.raises(TestSetValidationError, match="minimum number of cases"):
        validate_testset(testset, "heldout", min_cases={"ordinary": 100})


def test_case_without_arrays_fails(testset, tmp_path):
    d = _copy(testset, tmp_path)
    cases = load_split(d, "heldout")
    write_split_arrays(d / "heldout.npz", cases[1:])
    with pytest.raises(TestSetValidationError) as err:
        validate_testset(d, "heldout")
    text = _failure_text(err.value)
    assert "q, k and v of every manifest case are in the arrays file" in text
    assert cases[0].spec.case_id in text


def test_edited_manifest_digest_fails(testset, tmp_path):
    d = _copy(testset, tmp_path)
    manifest = load_manifest(d)
    write_manifest(d, manifest.model_copy(update={"digest": "0" * 64}))
    with pytest.raises(TestSetValidationError, match="set digests recorded in the manifest"):
        validate_testset(d, "heldout")
