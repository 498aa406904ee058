"""Preregistered thresholds: the versioned YAML schema and its loader.

A thresholds file is written (and frozen by :mod:`gates.preregistration`) before any
candidate is evaluated. It holds, per target platform (``tpu``, ``gpu``, ``cpu``):

* value criteria — ``report.metrics[metric] <op> value`` (e.g. ``accuracy.all.nan_count == 0``);
* change criteria — the candidate against the naive ``baseline`` or the current
  ``production`` version, expressed as an improvement factor (e.g. p50 latency at least
  1.2x better than the baseline; error at most 1.1x worse than production);

and, once per profile, whether ``not_assessed`` criteria block promotion, the canary
plan, the approval policy and, optionally, the adoption decision
(``gates.adoption_decision``). Metric names are those of ARCHITECTURE.md ("evaluation").

The file's bytes are what preregistration hashes, so :func:`load_thresholds` keeps the
sha256 of the exact bytes it parsed (``Thresholds.source_sha256``). Reading the bytes
(duplicate keys refused, schema versions, the v1 -> v2 mapping) is ``gates.thresholds_file``.
Every field declares where it is defined which change of it loosens the thresholds
(``gates.directions.limit``); ``gates.loosening`` compares two profiles by them.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import operator
from pathlib import Path
from typing import Literal

from pydantic import PrivateAttr, ValidationError, field_validator, model_validator

from gates.adoption_decision import DecisionPlan
from gates.approval_policy import ApprovalPolicy
from gates.canary_plan import CanaryPlan
from gates.directions import Looser as L
from gates.directions import limit
from gates.schema_base import _KEY, _N, Finite, Name, _Strict
from gates.serving_contract import ServingContract
from gates.speed_test import MIN_ALPHA, PAIRED_PERMUTATION, QUANTILE_OF, SPEED_FAMILY_ALPHA
from gates.thresholds_file import SCHEMA_VERSION, read_mapping
from gates.thresholds_file import upgrade_v1 as upgrade_v1  # re-exported

Platform = Literal["tpu", "gpu", "cpu"]
PLATFORMS: tuple[Platform, ...] = ("tpu", "gpu", "cpu")
CriterionKind = Literal["accuracy", "speed", "memory"]
Op = Literal["<=", "<", ">=", ">", "=="]

_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


def compare(observed: float, op: Op, threshold: float) -> bool:
    """Return ``observed <op> threshold`` for finite floats (callers reject NaN/inf first)."""
    return _OPS[op](observed, threshold)


_CATEGORY_METRICS = ("max_rel_error", "median_rel_error", "max_error_ratio_to_baseline",
                     "max_abs_error", "nan_count", "inf_count", "n_cases")
KNOWN_METRICS: frozenset[str] = frozenset(
    {f"accuracy.{cat}.{m}" for cat in ("ordinary", "hard", "adversarial", "all")
     for m in _CATEGORY_METRICS}
    | {"model.min_cosine_similarity", "model.mean_cosine_similarity", "latency.p50_s",
       "latency.p95_s", "latency.p99_s", "throughput.tflops", "memory.peak_bytes",
       "compile.time_s", "coverage.refused_cases"})
"""Metric names an evaluation report carries (ARCHITECTURE.md, "evaluation"): a criterion
naming anything else is a typo, refused when loaded, not failed as "missing" later."""


class _Criterion(_Strict):
    name: Name = limit(_N, why=_KEY,
                       description="Stable identifier shown in decisions, e.g. 'all-nan-free'.")
    metric: str = limit(L.ANY_CHANGE,
                        description="Metric name from the evaluation report (ARCHITECTURE.md).")
    kind: CriterionKind = limit(L.ANY_CHANGE)

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        if metric not in KNOWN_METRICS:
            close = difflib.get_close_matches(metric, sorted(KNOWN_METRICS), n=2, cutoff=0.8)
            family = sorted(m for m in KNOWN_METRICS if m.split(".")[0] == metric.split(".")[0])
            hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close else
                    f"known metrics of that family: {', '.join(family)}" if family else
                    "the metric names are listed in ARCHITECTURE.md")
            raise ValueError(f"unknown metric {metric!r}; {hint}")
        return metric
    native_only: bool | None = limit(
        L.ANY_CHANGE, compare="requires_native", default=None,
        description="Judge only when the candidate ran natively (report.speed_assessed); "
        "defaults to True for kind 'speed' and False otherwise.")

    @property
    def requires_native(self) -> bool:
        """Whether the criterion is ``not_assessed`` when the kernel did not run natively."""
        return self.kind == "speed" if self.native_only is None else self.native_only


class ValueCriterion(_Criterion):
    """``report.metrics[metric] <op> value``."""

    op: Op = limit(L.ANY_CHANGE)
    value: float = limit(L.BY_OP)

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"threshold value must be finite, got {v}")
        return v


class ChangeCriterion(_Criterion):
    """Candidate vs a reference (``baseline`` or ``production``) as an improvement factor.

    ``improvement = reference / candidate`` when lower is better (latency, error, bytes) and
    ``candidate / reference`` when higher is better (TFLOP/s, cosine similarity); both sides
    are first raised to ``floor`` so that tiny errors do not make the ratio noise.
    Exactly one of ``min_improvement`` (candidate must be at least this many times better,
    e.g. 1.2) and ``max_regression`` (candidate may be at most this many times worse, e.g.
    1.1, i.e. ``improvement >= 1/1.1``) is set.
    """

    against: Literal["baseline", "production"] = limit(L.ANY_CHANGE)
    better: Literal["lower", "higher"] = limit(L.ANY_CHANGE)
    min_improvement: Finite | None = limit(L.LOWER, default=None, gt=0, le=1000)
    max_regression: Finite | None = limit(L.HIGHER, default=None, ge=1, le=1000)
    floor: Finite = limit(L.HIGHER, default=0.0, ge=0)
    test: Literal["point_estimate", "paired_permutation"] | None = limit(
        L.ANY_CHANGE, default=None, compare="judged_by",
        description="How the bound is judged. Unset or 'point_estimate': the candidate's "
        "metric over the reference's, compared with the bound (the meaning of every "
        "registration made before this field existed). 'paired_permutation' (a "
        "max_regression bound on latency.p50_s/p95_s/p99_s): a one-sided paired "
        "permutation test on the interleaved per-repeat latencies (gates.speed_test) "
        "that fails only when a slowdown beyond max_regression is shown at `alpha`.")
    alpha: Finite | None = limit(
        L.LOWER, default=None, ge=MIN_ALPHA, lt=1,
        description=f"The paired test's one-sided level (at least {MIN_ALPHA:g}: below it "
        "no data could reject): an implementation exactly "
        "max_regression times the reference fails with probability <= alpha, an identical "
        "one far less. The alphas of a platform's tested criteria add up to at most "
        f"{SPEED_FAMILY_ALPHA} (Bonferroni), so an identical kernel passes all of them "
        f"with probability >= {1 - SPEED_FAMILY_ALPHA:g}.")

    @model_validator(mode="after")
    def _exactly_one_bound(self) -> ChangeCriterion:
        if (self.min_improvement is None) == (self.max_regression is None):
            raise ValueError(f"change criterion {self.name!r}: set exactly one of "
                             "min_improvement, max_regression")
        return self

    @model_validator(mode="after")
    def _a_test_needs_its_level(self) -> ChangeCriterion:
        if self.test != PAIRED_PERMUTATION:
            if self.alpha is not None:
                raise ValueError(f"change criterion {self.name!r}: alpha is the level of "
                                 f"test: {PAIRED_PERMUTATION}; the point estimate has none")
            return self
        problems = [why for bad, why in (
            (self.alpha is None, "an alpha"),
            (self.metric not in QUANTILE_OF, f"a latency quantile metric {sorted(QUANTILE_OF)}"),
            (self.max_regression is None, "a max_regression bound (min_improvement is a "
             "claim the candidate must show; this test only shows a regression)"),
            (self.floor != 0.0, "no floor")) if bad]
        if problems:
            raise ValueError(f"change criterion {self.name!r}: test: {PAIRED_PERMUTATION} "
                             f"needs {', '.join(problems)}")
        return self

    @property
    def judged_by(self) -> str:
        """The test that judges the bound (``point_estimate`` when ``test`` is unset)."""
        return self.test or "point_estimate"

    @property
    def required_improvement(self) -> float:
        """The minimum ``improvement`` factor that passes."""
        if self.min_improvement is not None:
            return self.min_improvement
        assert self.max_regression is not None
        return 1.0 / self.max_regression


_BY_NAME = {"key": "name", "label": "{key}: "}  # criteria: matched by name, shown "cpu/<name>: "


class PlatformCriteria(_Strict):
    """The criteria for candidates whose implementation is native to one platform."""

    value: list[ValueCriterion] = limit(L.FEWER, default_factory=list, **_BY_NAME)
    change: list[ChangeCriterion] = limit(L.FEWER, default_factory=list, **_BY_NAME)

    @model_validator(mode="after")
    def _unique_names(self) -> PlatformCriteria:
        names = [c.name for c in (*self.value, *self.change)]
        if not names:
            raise ValueError("a platform needs at least one criterion")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"criterion names must be unique per platform: {dupes}")
        spent = sum(c.alpha or 0.0 for c in self.change)
        if spent > SPEED_FAMILY_ALPHA + 1e-12:
            raise ValueError(f"the tested criteria's alphas add up to {spent:g} > "
                             f"{SPEED_FAMILY_ALPHA}: an identical kernel would fail one of "
                             "them more often than 1 in 20 (split the alpha between them)")
        return self


class Thresholds(_Strict):
    """A thresholds profile (one YAML file). See the module docstring."""

    schema_version: Literal[2] = limit(_N, why="the file format; v1 is upgraded when parsed")
    profile: str = limit(_N, why="the profile's name", min_length=1)
    description: str = limit(_N, why="words for people", default="")
    not_assessed_blocks_promotion: bool = limit(L.TRUE_TO_FALSE)
    min_cases_per_category: int = limit(
        L.LOWER, default=1, ge=0,
        description="An accuracy.{cat}.* criterion is inconclusive when accuracy.{cat}.n_cases "
        "is below this.")
    model_check_documents: int = limit(
        L.LOWER, default=16, ge=1, le=1024,
        description="Documents of the split whose MiniLM embeddings (the candidate inside "
        "the model vs float64 attention) the model.* criteria judge; a confirmation draw "
        "uses at most this many of its own documents.")
    serving_tpu_interpret_mode: bool = limit(
        L.TRUE_TO_FALSE, default=True,
        description="Where a Pallas TPU kernel runs interpreted (no TPU), its serving paths "
        "(the MiniLM check, shadow, canary) run in Pallas' TPU interpret mode (true: "
        "out-of-bounds, DMA and write-back checks on every request) or under the generic "
        "interpret=True lowering (false: the same outputs, compiled by XLA; "
        "kernels.interpreters). The accuracy cases run in TPU interpret mode either way.")
    platforms: dict[Platform, PlatformCriteria] = limit(L.FEWER, label="{key}/")
    serving: ServingContract = limit(
        L.NESTED, default_factory=ServingContract,
        description="what the registration serves (gates.serving_contract); default: everything")
    canary: CanaryPlan = limit(L.NESTED)
    approval: ApprovalPolicy = limit(L.NESTED)
    decision: DecisionPlan | None = limit(
        L.NESTED, default=None,
        description="adoption as a preregistered claim (gates.adoption_decision): after a "
        "passing canary, the candidate is adopted only if shown worth it over production; "
        "unset: no adoption test (a passing canary goes on, as without this section)")

    _source_sha256: str | None = PrivateAttr(default=None)
    _source_schema_version: int = PrivateAttr(default=SCHEMA_VERSION)

    @field_validator("platforms")
    @classmethod
    def _all_platforms(cls, v: dict[str, PlatformCriteria]) -> dict[str, PlatformCriteria]:
        missing = [p for p in PLATFORMS if p not in v]
        if missing:
            raise ValueError(f"thresholds must define every platform; missing {missing}")
        return v

    @model_validator(mode="after")
    def _canary_power(self) -> Thresholds:
        # The power rule binds where latency can block: on a profile where not-assessed
        # blocks promotion, every candidate that reaches the canary runs natively.
        problem = self.canary.power_problem()
        if problem and self.not_assessed_blocks_promotion:
            raise ValueError(f"canary latency plan: {problem}")
        return self

    @model_validator(mode="after")
    def _model_check_fits_the_criteria(self) -> Thresholds:
        if self.serving.model_check:
            return self
        judged = sorted({f"{p}/{c.name}" for p, crit in self.platforms.items()
                         for c in (*crit.value, *crit.change) if c.metric.startswith("model.")})
        if judged:
            raise ValueError(
                f"serving.model_check is false, so no MiniLM check runs, yet {judged} judge "
                "its model.* metrics (a missing metric fails): drop them or serve MiniLM")
        if self.canary.workload is None:
            raise ValueError(
                "serving.model_check false needs canary.workload: without MiniLM the shadow "
                "and canary must replay the model the family serves")
        return self

    @model_validator(mode="after")
    def _decision_fits_the_canary(self) -> Thresholds:
        if self.decision is None:
            return self
        if not self.canary.paired:
            raise ValueError("decision: the adoption test reads the canary's paired samples; "
                             "it needs the paired latency test (signed_rank_abba)")
        if self.decision.buckets and self.canary.workload is None:
            raise ValueError(
                f"decision.buckets ({self.decision.buckets}) needs canary.workload: the "
                "recorded MiniLM requests carry no length bucket, so every bucket would go "
                "unassessed; name a long-document workload for the canary to replay")
        pairs = sum(self.canary.pairs_per_step())
        if self.decision.max_pairs > pairs:
            raise ValueError(
                f"decision.max_pairs ({self.decision.max_pairs}) exceeds the {pairs} requests "
                "the canary's registered steps compare: a passing canary could end before the "
                "adoption test does; lower max_pairs or serve more canary requests")
        return self

    @property
    def source_sha256(self) -> str | None:
        """sha256 (hex) of the file bytes this profile was loaded from, or None if built in code."""
        return self._source_sha256

    @property
    def source_schema_version(self) -> int:
        """The schema version of the parsed file (1 or 2; 2 if built in code)."""
        return self._source_schema_version


def parse_thresholds(data: bytes, *, source: str = "<bytes>") -> Thresholds:
    """Parse YAML bytes (schema version 2, or 1 through ``upgrade_v1``) into
    :class:`Thresholds` and remember the sha256 of exactly ``data``.

    Raises:
        ValueError: the YAML is invalid (a repeated key included), not a mapping, of
            another schema version, or does not match the schema (pydantic's
            ``ValidationError`` is a ``ValueError``); the message names ``source``.
    """
    raw, version = read_mapping(data, source=source)
    try:
        thresholds = Thresholds.model_validate(raw)
    except ValidationError as err:
        # imported here: its error base loads the kernels package, which the command
        # line's refusal of a good file must not pay for
        from gates.thresholds_errors import InvalidThresholds, explain

        raise InvalidThresholds(explain(err, data, source=source, model=Thresholds)) from None
    thresholds._source_sha256 = hashlib.sha256(data).hexdigest()
    thresholds._source_schema_version = version
    return thresholds


def load_thresholds(path: str | Path) -> Thresholds:
    """Load and validate a thresholds YAML file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: invalid YAML or schema (see :func:`parse_thresholds`).
    """
    path = Path(path)
    return parse_thresholds(path.read_bytes(), source=str(path))
