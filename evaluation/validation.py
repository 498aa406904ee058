"""Great Expectations validation of a test set, run before any evaluation.

Three tables, each checked by its own expectation suite in one ephemeral GX Core
context (pandas data source):

* ``manifest_cases`` — one row per case of *every* split, from ``manifest.json``:
  unique case ids, unique case digests across the whole set (a case in two splits
  fails: split disjointness), categories and dtypes from the allowed sets,
  positive shapes, equal q/kv head_dim and batch, ``num_heads`` divisible by
  ``num_kv_heads``, 64-hex digests; plus ``manifest_documents``: no document
  (by sha256) in two splits; and ``manifest_digests``: the recorded split and
  set digests equal their recomputation from the case specs.
* ``case_summary`` — one row per case of the validated split, computed from its
  arrays: shape and dtype equal the manifest's, recomputed digest equals the
  manifest's, finite fraction 1, min/max within the dtype's range, lengths within
  ``[0, seq]``, and no manifest case without arrays.
* ``category_counts`` — cases per category of the split against a minimum.

GX range checks skip missing values and pandas reads NaN as missing, so every
range check is paired with a not-null check on the same column.

A failed suite stops evaluation: ``validate_testset`` raises
``TestSetValidationError`` carrying the ``ValidationOutcome`` (readable reasons plus
the GX result JSON, kept for lineage).

Kept in one module (over 350 lines) because the tables and the expectation suites
that judge them are read side by side: each expectation names a table column.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from evaluation.cases import (
    CATEGORIES,
    SPLIT_NAME_PATTERN,
    SPLITS,
    CaseSpec,
    TestCase,
    case_digest,
    split_kind,
)
from evaluation.testset import (
    TestSetManifest,
    load_manifest,
    load_split,
    set_digest,
    split_digest,
)
from kernels.errors import KernelgateError

logger = logging.getLogger(__name__)

DTYPE_NAMES = ("float32", "bfloat16", "float16")
MIN_CASES_PER_CATEGORY: dict[str, int] = {"ordinary": 3, "hard": 8, "adversarial": 6}
"""Fewest cases per category a split may have (the CI profile has 4/16/11)."""
_DIGEST_REGEX = r"^[0-9a-f]{64}$"


class FailedExpectation(BaseModel):
    """One expectation that failed, in words.

    Attributes:
        table: ``manifest_cases``, ``manifest_documents``, ``manifest_digests``,
            ``case_summary`` or ``category_counts``.
        expectation: GX expectation type, e.g. ``expect_column_values_to_not_be_null``.
        columns: the columns it checks.
        description: what the expectation means for a test set.
        failing: identifiers of the failing rows (case ids, documents or categories).
        reason: one readable sentence combining the above.
    """

    model_config = ConfigDict(extra="forbid")

    table: str
    expectation: str
    columns: list[str]
    description: str
    failing: list[str]
    observed: str | None = None
    reason: str


class ValidationOutcome(BaseModel):
    """The result of validating one split of a test set.

    ``gx_result`` maps table name to GX's ``ExpectationSuiteValidationResult`` JSON.
    """

    model_config = ConfigDict(extra="forbid")

    success: bool
    directory: str
    split: str = Field(pattern=SPLIT_NAME_PATTERN)
    testset_digest: str
    split_digest: str
    n_expectations: int
    failures: list[FailedExpectation]
    gx_version: str
    validated_at: datetime
    gx_result: dict[str, Any] = Field(repr=False)

    def reasons(self) -> list[str]:
        """One sentence per failed expectation."""
        return [f.reason for f in self.failures]


class TestSetValidationError(KernelgateError):
    """The test set failed validation; ``outcome`` says why. Evaluation must stop."""

    __test__ = False  # not a pytest class

    def __init__(self, outcome: ValidationOutcome):
        self.outcome = outcome
        reasons = "; ".join(outcome.reasons()) or "no reason recorded"
        super().__init__(f"test set {outcome.directory} split {outcome.split} failed "
                         f"validation ({len(outcome.failures)} expectations): {reasons}")


# --- tables --------------------------------------------------------------------------------


def _shape(shape) -> str:
    return "x".join(str(int(n)) for n in shape)


def manifest_table(manifest: TestSetManifest) -> pd.DataFrame:
    """One row per case of every split: identifiers, category, dtype, shape fields, digest."""
    rows = []
    for split, entry in manifest.entries().items():
        for s in entry.cases:
            (b, q_len, heads, d), (kb, kv_len, kv_heads, kd) = s.q_shape, s.kv_shape
            rows.append({
                "case_id": s.case_id, "split": split, "category": s.category, "dtype": s.dtype,
                "batch": b, "kv_batch": kb, "q_len": q_len, "kv_len": kv_len,
                "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": d, "kv_head_dim": kd,
                "heads_remainder": heads % kv_heads if kv_heads else -1,
                "digest": s.digest,
            })
    return pd.DataFrame(rows)


def documents_table(manifest: TestSetManifest) -> pd.DataFrame:
    """One row per (split, document)."""
    rows = [{"document": f"{split}:{d.name}", "split": split, "sha256": d.sha256}
            for split, entry in manifest.entries().items() for d in entry.documents]
    return pd.DataFrame(rows, columns=["document", "split", "sha256"])


def _dtype_range(dtype: str) -> tuple[float, float]:
    if dtype not in DTYPE_NAMES:
        return float("nan"), float("nan")
    import jax.numpy as jnp

    info = jnp.finfo(jnp.dtype(dtype))
    return float(info.min), float(info.max)


def _lengths_valid(case: TestCase) -> bool:
    batch, q_len, kv_len = case.q.shape[0], case.q.shape[1], case.k.shape[1]
    for lengths, limit in ((case.q_lengths, q_len), (case.kv_lengths, kv_len)):
        if lengths is None:
            continue
        if lengths.shape != (batch,) or not np.issubdtype(lengths.dtype, np.integer):
            return False
        if lengths.size and (lengths.min() < 0 or lengths.max() > limit):
            return False
    return True


def summarise_case(case: TestCase) -> dict[str, Any]:
    """Statistics of one case's arrays next to what the manifest claims.

    ``min``/``max`` are over q, k and v in float64 and are NaN when any value is NaN
    (so the not-null checks catch it); ``finite_fraction`` is the fraction of finite
    values.
    """
    s = case.spec
    qkv = [np.asarray(a) for a in (case.q, case.k, case.v)]
    dtypes = {a.dtype.name for a in qkv}
    values = np.concatenate([a.astype(np.float64).ravel() for a in qkv])
    lowest, highest = _dtype_range(s.dtype)
    has_lengths = case.q_lengths is not None or case.kv_lengths is not None
    return {
        "case_id": s.case_id, "category": s.category,
        "dtype_manifest": s.dtype,
        "dtype_actual": dtypes.pop() if len(dtypes) == 1 else
        "mixed(" + ",".join(f"{n}={a.dtype.name}" for n, a in zip("qkv", qkv, strict=True)) + ")",
        "q_shape_manifest": _shape(s.q_shape), "q_shape_actual": _shape(case.q.shape),
        "kv_shape_manifest": _shape(s.kv_shape), "k_shape_actual": _shape(case.k.shape),
        "v_shape_actual": _shape(case.v.shape),
        "has_lengths_manifest": s.has_lengths, "has_lengths_actual": has_lengths,
        "lengths_valid": _lengths_valid(case),
        "finite_fraction": float(np.isfinite(values).mean()) if values.size else float("nan"),
        "min": float(values.min()) if values.size else float("nan"),
        "max": float(values.max()) if values.size else float("nan"),
        "dtype_lowest": lowest, "dtype_highest": highest,
        "digest_manifest": s.digest,
        "digest_actual": case_digest(case.arrays(), causal=s.causal, scale=s.scale),
    }


def summary_table(cases: list[TestCase], specs: list[CaseSpec] | None = None) -> pd.DataFrame:
    """``summarise_case`` for every case, one row each; with ``specs`` (the manifest's),
    a case without arrays gets a row with ``arrays_present`` False and no statistics."""
    rows = [{**summarise_case(c), "arrays_present": True} for c in cases]
    loaded = {c.spec.case_id for c in cases}
    for spec in specs or []:
        if spec.case_id not in loaded:
            lowest, highest = _dtype_range(spec.dtype)
            rows.append({"case_id": spec.case_id, "category": spec.category,
                         "dtype_manifest": spec.dtype, "q_shape_manifest": _shape(spec.q_shape),
                         "kv_shape_manifest": _shape(spec.kv_shape),
                         "has_lengths_manifest": spec.has_lengths, "dtype_lowest": lowest,
                         "dtype_highest": highest, "digest_manifest": spec.digest,
                         "arrays_present": False})
    return pd.DataFrame(rows)


def digest_table(manifest: TestSetManifest) -> pd.DataFrame:
    """Split and set digests as recorded next to their recomputation from the case specs."""
    rows = [{"digest_of": f"split:{name}", "recorded": entry.digest,
             "recomputed": split_digest(entry.cases)} for name, entry in manifest.entries().items()]
    rows.append({"digest_of": "set", "recorded": manifest.digest,
                 "recomputed": set_digest(manifest.splits)})
    return pd.DataFrame(rows)


def category_table(specs: list[CaseSpec], minimum: dict[str, int]) -> pd.DataFrame:
    """Cases per category (every category, zero included) and the required minimum."""
    return pd.DataFrame([{"category": c, "n_cases": sum(s.category == c for s in specs),
                          "minimum": int(minimum.get(c, 0))} for c in CATEGORIES])


# --- suites -------------------------------------------------------------------------------


def _suites(gxe) -> dict[str, tuple[str, list]]:
    """Table name -> (row id column, expectations). Each expectation's description
    says what it guards, and becomes the readable reason when it fails."""

    def not_null(col):
        return gxe.ExpectColumnValuesToNotBeNull(column=col, description=f"{col} is present (not NaN/None)")

    shape_cols = ("batch", "kv_batch", "q_len", "kv_len", "num_heads", "num_kv_heads",
                  "head_dim", "kv_head_dim")
    manifest = [
        gxe.ExpectColumnValuesToBeUnique(column="case_id", description="case ids are unique"),
        gxe.ExpectColumnValuesToBeUnique(
            column="digest", description="no case (by content digest) appears twice, "
            "in particular not in two splits (split disjointness)"),
        gxe.ExpectColumnValuesToMatchRegex(column="digest", regex=_DIGEST_REGEX,
                                           description="case digests are 64 hex characters"),
        gxe.ExpectColumnValuesToBeInSet(column="category", value_set=list(CATEGORIES),
                                        description=f"category is one of {list(CATEGORIES)}"),
        gxe.ExpectColumnValuesToBeInSet(column="dtype", value_set=list(DTYPE_NAMES),
                                        description=f"dtype is one of {list(DTYPE_NAMES)}"),
        gxe.ExpectColumnValuesToMatchRegex(
            column="split", regex=SPLIT_NAME_PATTERN,
            description=f"split is one of {list(SPLITS)} or a confirmation draw confirmation-<k>"),
        *[e for col in shape_cols for e in (
            not_null(col),
            gxe.ExpectColumnValuesToBeBetween(column=col, min_value=1,
                                              description=f"{col} is positive"))],
        gxe.ExpectColumnPairValuesToBeEqual(column_A="head_dim", column_B="kv_head_dim",
                                            description="q and k/v have the same head_dim"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="batch", column_B="kv_batch",
                                            description="q and k/v have the same batch size"),
        gxe.ExpectColumnValuesToBeInSet(column="heads_remainder", value_set=[0],
                                        description="num_heads is divisible by num_kv_heads (GQA)"),
    ]
    documents = [
        gxe.ExpectColumnValuesToBeUnique(
            column="sha256", description="no document (by sha256) serves two splits"),
        gxe.ExpectColumnValuesToMatchRegex(column="sha256", regex=_DIGEST_REGEX,
                                           description="document digests are 64 hex characters"),
    ]
    digests = [
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="recorded", column_B="recomputed",
            description="the split and set digests recorded in the manifest match its cases"),
    ]
    summary = [
        gxe.ExpectColumnValuesToBeUnique(column="case_id", description="case ids are unique"),
        gxe.ExpectColumnValuesToBeInSet(
            column="arrays_present", value_set=[True],
            description="q, k and v of every manifest case are in the arrays file"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="dtype_manifest", column_B="dtype_actual",
                                            description="q/k/v dtype equals the manifest's"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="q_shape_manifest", column_B="q_shape_actual",
                                            description="q shape equals the manifest's"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="kv_shape_manifest", column_B="k_shape_actual",
                                            description="k shape equals the manifest's kv shape"),
        gxe.ExpectColumnPairValuesToBeEqual(column_A="kv_shape_manifest", column_B="v_shape_actual",
                                            description="v shape equals the manifest's kv shape"),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="has_lengths_manifest", column_B="has_lengths_actual",
            description="q_lengths/kv_lengths are stored exactly when the manifest says so"),
        gxe.ExpectColumnValuesToBeInSet(column="lengths_valid", value_set=[True],
                                        description="lengths are int [batch] within [0, seq]"),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="digest_manifest", column_B="digest_actual",
            description="the digest recomputed from the arrays equals the manifest's"),
        not_null("finite_fraction"),
        gxe.ExpectColumnValuesToBeBetween(column="finite_fraction", min_value=1.0, max_value=1.0,
                                          description="every q/k/v value is finite"),
        not_null("min"),
        not_null("max"),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="min", column_B="dtype_lowest", or_equal=True,
            description="the smallest value is within the dtype's range"),
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="dtype_highest", column_B="max", or_equal=True,
            description="the largest value is within the dtype's range"),
    ]
    counts = [
        gxe.ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="n_cases", column_B="minimum", or_equal=True,
            description="each category has at least its minimum number of cases"),
    ]
    return {"manifest_cases": ("case_id", manifest), "manifest_documents": ("document", documents),
            "manifest_digests": ("digest_of", digests),
            "case_summary": ("case_id", summary), "category_counts": ("category", counts)}


def _plain(value) -> str:
    """``np.float64(1.0)`` -> ``1.0``; tuples element-wise (GX returns NumPy scalars)."""
    if isinstance(value, tuple | list):
        return "(" + ", ".join(_plain(v) for v in value) + ")"
    return str(value.item() if isinstance(value, np.generic) else value)


def _failure(table: str, id_column: str, result) -> FailedExpectation:
    config = result.expectation_config
    kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
    columns = [str(kwargs[k]) for k in ("column", "column_A", "column_B") if k in kwargs]
    res = result.result or {}
    failing = []
    for row in res.get("unexpected_index_list") or []:
        ident = row.get(id_column) if isinstance(row, dict) else row
        if ident is not None and str(ident) not in failing:
            failing.append(str(ident))
    observed = None
    if res.get("partial_unexpected_list"):
        observed = ", ".join(_plain(v) for v in res["partial_unexpected_list"][:5])
    elif "observed_value" in res:
        observed = _plain(res["observed_value"])
    description = config.description or config.type
    if result.exception_info and result.exception_info.get("raised_exception"):
        observed = str(result.exception_info.get("exception_message"))
    reason = f"{table}: expected {description} ({config.type} on {', '.join(columns)})"
    if failing:
        reason += f"; fails for {', '.join(failing[:8])}" + (" ..." if len(failing) > 8 else "")
    if observed:
        reason += f"; observed {observed}"
    return FailedExpectation(table=table, expectation=config.type, columns=columns,
                             description=description, failing=failing, observed=observed,
                             reason=reason)


def run_suites(tables: dict[str, pd.DataFrame], *, data_docs: dict[str, str] | None = None
               ) -> tuple[dict[str, Any], list[FailedExpectation], int]:
    """Validate each table against its suite in an ephemeral GX context.

    Args:
        data_docs: when given, filled with each table's validation result rendered as
            GX Data Docs HTML (GX's own page renderer), for people reading the record.

    Returns:
        ``(gx result JSON per table, failures, number of expectations run)``.
    """
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("kernelgate_testset")
    results: dict[str, Any] = {}
    failures: list[FailedExpectation] = []
    n = 0
    for table, (id_column, expectations) in _suites(gxe).items():
        batch = source.add_dataframe_asset(name=table).add_batch_definition_whole_dataframe(table)
        # The expectations go in with the suite: added one by one, the context's store
        # serialised the whole suite again after each.
        suite = context.suites.add(gx.ExpectationSuite(name=f"kernelgate_testset_{table}",
                                                       expectations=list(expectations)))
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"kernelgate_testset_{table}", data=batch, suite=suite))
        result = definition.run(
            batch_parameters={"dataframe": tables[table]},
            result_format={"result_format": "COMPLETE", "unexpected_index_column_names": [id_column]})
        # Round-trip through JSON so the kept result holds plain types only (GX leaves
        # NumPy scalars in unexpected values).
        results[table] = json.loads(json.dumps(result.to_json_dict(), default=_plain))
        n += len(result.results)
        failures += [_failure(table, id_column, r) for r in result.results if not r.success]
        if data_docs is not None:
            from great_expectations.render.renderer import ValidationResultsPageRenderer
            from great_expectations.render.view import DefaultJinjaPageView

            data_docs[table] = DefaultJinjaPageView().render(
                ValidationResultsPageRenderer().render(result))
    return results, failures, n


def validate_testset(directory: str | Path, split: str, *, result_path: str | Path | None = None,
                     min_cases: dict[str, int] | None = None,
                     raise_on_failure: bool = True) -> ValidationOutcome:
    """Validate the manifest and one split's arrays with Great Expectations.

    Args:
        directory: a test set written by ``evaluation.testset.build_testset``.
        split: the split (or confirmation draw) about to be evaluated.
        result_path: where to write the outcome JSON (with the GX results), if given;
            written on success and on failure, with the results rendered as GX Data Docs
            HTML beside it (``<stem>-data-docs/<table>.html``).
        min_cases: minimum cases per category (default ``MIN_CASES_PER_CATEGORY``).
        raise_on_failure: raise when any expectation fails (default); with ``False``
            the caller must check ``outcome.success``.

    Returns:
        The ``ValidationOutcome``.

    Raises:
        TestSetValidationError: an expectation failed (carries the outcome).
        FileNotFoundError, KeyError, ValueError, pydantic.ValidationError: the test
            set cannot be read at all (missing files, unknown split, broken manifest).
    """
    import great_expectations as gx

    split_kind(split)
    manifest = load_manifest(directory)
    cases = load_split(directory, split, manifest=manifest, skip_missing=True)
    tables = {
        "manifest_cases": manifest_table(manifest),
        "manifest_documents": documents_table(manifest),
        "manifest_digests": digest_table(manifest),
        "case_summary": summary_table(cases, manifest.split(split).cases),
        "category_counts": category_table(manifest.split(split).cases, MIN_CASES_PER_CATEGORY if min_cases is None
                                          else min_cases),
    }
    pages: dict[str, str] = {}
    results, failures, n = run_suites(tables, data_docs=pages if result_path is not None else None)
    outcome = ValidationOutcome(
        success=not failures, directory=str(directory), split=split,
        testset_digest=manifest.digest, split_digest=manifest.split(split).digest,
        n_expectations=n, failures=failures, gx_version=gx.__version__,
        validated_at=datetime.now(UTC), gx_result=results)
    if result_path is not None:
        path = Path(result_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(outcome.model_dump(mode="json"), indent=2, default=str))
        docs = path.parent / f"{path.stem}-data-docs"  # GX Data Docs: one page per table
        docs.mkdir(exist_ok=True)
        for table, html in pages.items():
            (docs / f"{table}.html").write_text(html)
    if failures:
        logger.error("test set validation failed: %s", "; ".join(outcome.reasons()))
        if raise_on_failure:
            raise TestSetValidationError(outcome)
    else:
        logger.info("test set %s split %s passed %d expectations", directory, split, n)
    return outcome
