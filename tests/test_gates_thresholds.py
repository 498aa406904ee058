"""The thresholds schema and the two shipped profiles."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gates.thresholds import PLATFORMS, load_thresholds, parse_thresholds
from tests.conftest_lineage import thresholds_yaml

ROOT = Path(__file__).resolve().parents[1]
METRIC_PATTERNS = (
    "accuracy.{cat}.max_rel_error",
    "accuracy.{cat}.median_rel_error",
    "accuracy.{cat}.max_error_ratio_to_baseline",
    "accuracy.{cat}.max_abs_error",
    "accuracy.{cat}.nan_count",
    "accuracy.{cat}.inf_count",
    "accuracy.{cat}.n_cases",
)
KNOWN_METRICS = {
    p.format(cat=c) for p in METRIC_PATTERNS for c in ("ordinary", "hard", "adversarial", "all")
} | {
    "model.min_cosine_similarity",
    "model.mean_cosine_similarity",
    "latency.p50_s",
    "latency.p95_s",
    "latency.p99_s",
    "throughput.tflops",
    "memory.peak_bytes",
    "compile.time_s",
}


@pytest.mark.parametrize("name", ["local-dry-run.yaml", "staging.yaml", "production.yaml"])
def test_shipped_profiles_load_and_use_only_known_metrics(name):
    path = ROOT / "thresholds" / name
    thresholds = load_thresholds(path)
    assert thresholds.source_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    for platform in PLATFORMS:
        criteria = thresholds.platforms[platform]
        metrics = {c.metric for c in (*criteria.value, *criteria.change)}
        assert metrics <= KNOWN_METRICS, metrics - KNOWN_METRICS
        # NaN outputs never pass, on any platform
        assert any(
            c.metric == "accuracy.all.nan_count" and c.op == "==" and c.value == 0
            for c in criteria.value
        )
        # speed is judged only natively
        assert all(c.requires_native for c in criteria.change if c.kind == "speed")
    fractions = [s.traffic_fraction for s in thresholds.canary.steps]
    assert fractions == ([0.25, 0.5] if name == "staging.yaml" else [0.05, 0.25, 0.5])


def test_staging_is_production_with_a_small_canary():
    """The walkthrough profile judges by production's criteria and asks a person at the
    same transitions; only the canary is small (and every step still serves the
    candidate dozens of requests) and the timeout shorter."""
    staging = load_thresholds(ROOT / "thresholds" / "staging.yaml")
    production = load_thresholds(ROOT / "thresholds" / "production.yaml")
    assert staging.platforms == production.platforms
    assert staging.not_assessed_blocks_promotion and staging.min_cases_per_category == \
        production.min_cases_per_category
    assert staging.approval.required_for == production.approval.required_for
    assert not staging.approval.auto_approve
    assert staging.canary.latency == production.canary.latency
    assert sum(s.requests for s in staging.canary.steps) * 20 < sum(
        s.requests for s in production.canary.steps)
    assert all(s.requests * s.traffic_fraction >= 20 for s in staging.canary.steps)


def test_profiles_differ_where_the_design_says():
    local = load_thresholds(ROOT / "thresholds" / "local-dry-run.yaml")
    production = load_thresholds(ROOT / "thresholds" / "production.yaml")
    assert not local.not_assessed_blocks_promotion and production.not_assessed_blocks_promotion
    assert not local.approval.requires_person("canary->production")
    assert production.approval.requires_person("canary->production")
    assert local.approval.auto_approve and local.approval.auto_approve_reason
    assert not production.approval.auto_approve
    # on accelerators the candidate must beat naive by >= 1.2x at p50
    for thresholds in (local, production):
        for platform in ("gpu", "tpu"):
            (speedup,) = [
                c
                for c in thresholds.platforms[platform].change
                if c.metric == "latency.p50_s" and c.against == "baseline"
            ]
            assert speedup.required_improvement == pytest.approx(1.2)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("schema_version: 2", "schema_version: 3"), "schema_version"),
        (lambda t: t.replace("  cpu:\n", "  cpux:\n"), "cpux"),
        (
            lambda t: t.replace(
                "min_improvement: 1.2", "min_improvement: 1.2, max_regression: 1.1"
            ),
            "exactly one",
        ),
        (lambda t: t.replace("auto_approve: false", "auto_approve: true"), "auto_approve_reason"),
        (
            lambda t: t.replace("traffic_fraction: 0.5,", "traffic_fraction: 0.01,"),
            "strictly increase",
        ),
        (lambda t: t.replace('op: "=="', 'op: "~="'), "op"),
        (lambda t: t.replace("value: 0}", "value: .nan}"), "finite"),
        (lambda t: t.replace("profile: test", "profile: test\nsurprise: 1"), "surprise"),
        (lambda t: "- just a list\n", "mapping"),
    ],
)
def test_schema_violations_are_named(edit, message):
    text = edit(thresholds_yaml())
    with pytest.raises(ValueError, match=message):
        parse_thresholds(text.encode())


def test_hash_tracks_bytes_not_meaning():
    text = thresholds_yaml()
    a = parse_thresholds(text.encode())
    b = parse_thresholds((text + "# a comment\n").encode())
    assert a.model_dump() == b.model_dump()  # same content...
    assert a.source_sha256 != b.source_sha256  # ...but a different file: preregistration notices


def test_a_misspelled_metric_is_refused_when_the_file_is_loaded():
    text = (ROOT / "thresholds" / "local-dry-run.yaml").read_text()
    assert "accuracy.all.nan_count" in text
    with pytest.raises(ValueError, match="unknown metric 'accuracy.all.nan_cout'"):
        parse_thresholds(text.replace("accuracy.all.nan_count", "accuracy.all.nan_cout", 1).encode(),
                         source="typo.yaml")
