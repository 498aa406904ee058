"""The thresholds schema and the two shipped profiles."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest

from gates.loosening import loosenings
from gates.thresholds import PLATFORMS, load_thresholds, parse_thresholds, upgrade_v1
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
    "coverage.refused_cases",
}


@pytest.mark.parametrize("name", ["local-dry-run.yaml", "local-interpreted.yaml", "staging.yaml",
                                  "production.yaml", "bf16-long.yaml", "adoption.yaml"])
def test_shipped_profiles_load_and_use_only_known_metrics(name):
    path = ROOT / "thresholds" / name
    thresholds = load_thresholds(path)
    assert thresholds.source_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    for platform in PLATFORMS:
        criteria = thresholds.platforms[platform]
        metrics = {c.metric for c in (*criteria.value, *criteria.change)}
        assert metrics <= KNOWN_METRICS, metrics - KNOWN_METRICS
        # a kernel must run every case its registration serves (refusals fail coverage)
        assert any(c.metric == "coverage.refused_cases" and c.op == "==" and c.value == 0
                   for c in criteria.value)
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


def test_the_interpreted_profile_is_local_dry_run_at_smaller_declared_sizes():
    """local-interpreted (``make run`` on a CPU host) judges by local-dry-run's criteria,
    contract and approval; only the sizes differ: fewer MiniLM documents and a canary
    that states it cannot reach its latency power (so latency is *not assessed*, with
    that reason, never silently judged on too few requests)."""
    local = load_thresholds(ROOT / "thresholds" / "local-dry-run.yaml")
    quick = load_thresholds(ROOT / "thresholds" / "local-interpreted.yaml")
    assert quick.profile != local.profile  # a registration (and chain) of its own
    assert quick.platforms == local.platforms and quick.serving == local.serving
    assert quick.approval == local.approval and quick.canary.latency == local.canary.latency
    assert not quick.not_assessed_blocks_promotion
    assert 1 <= quick.model_check_documents < local.model_check_documents
    assert sum(quick.canary.pairs_per_step()) < sum(local.canary.pairs_per_step())
    assert local.canary.power_problem() is None
    assert "cannot reach its power" in quick.canary.power_problem()
    # the canary still compares requests at every step
    assert all(n >= 1 for n in quick.canary.pairs_per_step())
    # serving paths under the generic interpret lowering; every other profile keeps TPU
    # interpret mode there (the default)
    assert not quick.serving_tpu_interpret_mode
    for name in ("local-dry-run", "staging", "production", "bf16-long"):
        assert load_thresholds(ROOT / "thresholds" / f"{name}.yaml").serving_tpu_interpret_mode


def test_model_check_documents_defaults_to_sixteen_and_fewer_is_looser():
    from gates.loosening import loosenings

    text = thresholds_yaml()
    default = parse_thresholds(text.encode())
    assert default.model_check_documents == 16
    fewer = parse_thresholds((text + "model_check_documents: 4\n").encode())
    more = parse_thresholds((text + "model_check_documents: 32\n").encode())
    assert any("model_check_documents" in str(x) for x in loosenings(default, fewer))
    assert not any("model_check_documents" in str(x) for x in loosenings(default, more))
    with pytest.raises(ValueError, match="model_check_documents"):
        parse_thresholds((text + "model_check_documents: 0\n").encode())


def test_serving_tpu_interpret_mode_defaults_to_true_and_off_is_looser():
    """The generic lowering checks less than TPU interpret mode (kernels.interpreters),
    so switching the serving paths to it after a registration is a loosening."""
    from gates.loosening import loosenings

    text = thresholds_yaml()
    default = parse_thresholds(text.encode())
    assert default.serving_tpu_interpret_mode is True
    off = parse_thresholds((text + "serving_tpu_interpret_mode: false\n").encode())
    assert any("serving_tpu_interpret_mode" in str(x) for x in loosenings(default, off))
    assert not any("serving_tpu_interpret_mode" in str(x) for x in loosenings(off, default))


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
    with pytest.raises(ValueError, match="unknown metric 'accuracy.all.nan_cout'") as refused:
        parse_thresholds(text.replace("accuracy.all.nan_count", "accuracy.all.nan_cout", 1).encode(),
                         source="typo.yaml")
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "accuracy.all.nan_count" in t)
    said = str(refused.value)
    assert (f"typo.yaml:{line}: platforms.tpu.value.0.metric: unknown metric "
            "'accuracy.all.nan_cout'; did you mean 'accuracy.all.nan_count'") in said, said
    assert "Value error" not in said and max(map(len, said.splitlines())) < 300, said


def test_a_metric_with_no_near_name_is_refused_naming_its_family():
    text = (ROOT / "thresholds" / "local-dry-run.yaml").read_text()
    with pytest.raises(ValueError, match=r"unknown metric 'latency\.median_seconds'; known metrics of "
                       r"that family: latency\.p50_s, latency\.p95_s, latency\.p99_s"):
        parse_thresholds(text.replace("latency.p50_s", "latency.median_seconds", 1).encode())


# --- schema versions: v1 files (stored registrations) parse through upgrade_v1 -----------

def _v1(text: str) -> str:
    assert text.count("schema_version: 2\n") == 1
    return text.replace("schema_version: 2\n", "schema_version: 1\n")


@pytest.mark.parametrize("name", ["local-dry-run.yaml", "staging.yaml", "production.yaml"])
def test_a_v1_file_parses_to_the_same_profile_and_hashes_its_own_bytes(name):
    v2_bytes = (ROOT / "thresholds" / name).read_bytes()
    v1_bytes = _v1(v2_bytes.decode()).encode()
    v1, v2 = parse_thresholds(v1_bytes), parse_thresholds(v2_bytes)
    assert v1.model_dump() == v2.model_dump()
    assert v1.schema_version == 2 and v1.source_schema_version == 1
    assert v2.source_schema_version == 2
    assert v1.source_sha256 == hashlib.sha256(v1_bytes).hexdigest() != v2.source_sha256


def test_upgrade_v1_is_a_pure_mapping_that_changes_only_the_version():
    raw = {"schema_version": 1, "profile": "p", "canary": {"max_nan_count": 0}}
    before = copy.deepcopy(raw)
    upgraded = upgrade_v1(raw)
    assert raw == before  # the input is not changed
    assert upgraded == {"schema_version": 2, "profile": "p", "canary": {"max_nan_count": 0}}
    with pytest.raises(ValueError, match="schema_version 1"):
        upgrade_v1(upgraded)


def test_a_chain_compares_a_v1_registration_with_a_v2_one():
    v1 = parse_thresholds(_v1(thresholds_yaml()).encode())
    same = parse_thresholds(thresholds_yaml().encode())
    looser = parse_thresholds(thresholds_yaml().replace("max_nan_count: 0", "max_nan_count: 5")
                              .encode())
    assert loosenings(v1, same) == []
    assert loosenings(v1, looser) == ["canary.max_nan_count 0 -> 5"]


@pytest.mark.parametrize("version", ["0", "3", "true", '"2"', "2.5"])
def test_other_schema_versions_are_refused(version):
    text = thresholds_yaml().replace("schema_version: 2\n", f"schema_version: {version}\n")
    with pytest.raises(ValueError, match="schema_version must be 2"):
        parse_thresholds(text.encode(), source="other.yaml")


# --- a repeated key is refused, not silently resolved to the last one ----------------------

def test_a_repeated_key_in_a_criterion_is_refused_naming_key_and_line():
    text = thresholds_yaml()
    bound = 'op: "<=", value: 2.0}'
    assert bound in text
    text = text.replace(bound, 'op: "<=", value: 2.0, value: 1.0e+6}', 1)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "value: 1.0e+6" in row)
    with pytest.raises(ValueError, match="duplicate.yaml") as refused:
        parse_thresholds(text.encode(), source="duplicate.yaml")
    assert f"found duplicate key 'value' at line {line}" in str(refused.value)


def test_a_repeated_top_level_key_is_refused_with_both_lines():
    text = thresholds_yaml()
    first = next(i for i, row in enumerate(text.splitlines(), 1)
                 if row.startswith("min_cases_per_category:"))
    text += "min_cases_per_category: 0\n"
    last = len(text.splitlines())
    with pytest.raises(ValueError, match=f"duplicate key 'min_cases_per_category' at line "
                                         f"{last} \\(first at line {first}\\)"):
        parse_thresholds(text.encode())


def test_anchors_and_merge_keys_still_load():
    text = thresholds_yaml().replace("  tpu:\n", "  tpu: &native\n", 1)
    head, _, rest = text.partition("  gpu:\n")
    _, _, tail = rest.partition("  cpu:\n")
    aliased = parse_thresholds(f"{head}  gpu: *native\n  cpu:\n{tail}".encode())
    assert aliased.platforms["gpu"] == aliased.platforms["tpu"]
    merged = thresholds_yaml().replace(
        "  max_error_count: 0\n", "  <<: {max_error_count: 5}\n  max_error_count: 0\n")
    assert parse_thresholds(merged.encode()).canary.max_error_count == 0


def test_production_takes_only_signed_approvals_and_staging_keeps_ui_answers():
    production = load_thresholds(ROOT / "thresholds" / "production.yaml")
    staging = load_thresholds(ROOT / "thresholds" / "staging.yaml")
    assert production.approval.require_signed and "canary->production" in production.approval.required_for
    assert not staging.approval.require_signed


# --- errors a person can act on: file:line, once per place in the file, did you mean ----

def _typo(text: str, old: str, new: str, count: int = -1) -> str:
    assert old in text
    return text.replace(old, new, count)


def test_a_misspelt_key_is_named_once_per_place_with_its_line_and_the_field_meant():
    """``metirc`` in the block that ``gpu: *native`` repeats, and again in ``cpu``'s own
    block: two problems (not six pydantic errors), each with its line; the alias path is
    said beside the anchored one."""
    text = (ROOT / "thresholds" / "local-dry-run.yaml").read_text()
    bad = _typo(text, "{name: nan-free, metric:", "{name: nan-free, metirc:")
    lines = [n + 1 for n, line in enumerate(bad.splitlines()) if "metirc" in line]
    assert len(lines) == 2
    with pytest.raises(ValueError) as refused:
        parse_thresholds(bad.encode(), source="typo.yaml")
    message = str(refused.value)
    assert message.splitlines() == [
        "typo.yaml is not a valid thresholds file (2 problems):",
        f"  typo.yaml:{lines[0]}: platforms.tpu.value.0: unknown key 'metirc'; did you mean "
        "'metric'? (also platforms.gpu.value.0: the same lines, through a YAML alias)",
        f"  typo.yaml:{lines[1]}: platforms.cpu.value.0: unknown key 'metirc'; did you mean "
        "'metric'?"]
    assert "errors.pydantic.dev" not in message and "Field required" not in message


def test_a_misspelt_optional_key_gets_the_schema_field_it_resembles():
    text = (ROOT / "thresholds" / "local-dry-run.yaml").read_text()
    bad = _typo(text, "noise_sd:", "noise_sdd:")
    line = next(n + 1 for n, s in enumerate(bad.splitlines()) if "noise_sdd" in s)
    with pytest.raises(ValueError, match=(
            rf"x.yaml:{line}: canary.latency: unknown key 'noise_sdd'; did you mean 'noise_sd'\?")):
        parse_thresholds(bad.encode(), source="x.yaml")


def test_a_value_error_keeps_its_reason_and_gains_its_line():
    text = (ROOT / "thresholds" / "local-dry-run.yaml").read_text()
    bad = _typo(text, 'op: "<="', 'op: "~="', 1)
    number = next(n + 1 for n, s in enumerate(bad.splitlines()) if '"~="' in s)
    with pytest.raises(ValueError) as refused:
        parse_thresholds(bad.encode(), source="op.yaml")
    lines = str(refused.value).splitlines()
    assert lines[0] == "op.yaml is not a valid thresholds file (1 problem):"
    assert lines[1].startswith(f"  op.yaml:{number}: platforms.tpu.value.") and "'~='" in lines[1]
    assert "a YAML alias" in lines[1] and len(lines) == 2  # gpu shares the block


def test_an_unknown_key_far_from_every_field_gets_no_suggestion():
    with pytest.raises(ValueError) as refused:
        parse_thresholds(thresholds_yaml().replace("profile: test", "profile: test\nzzzqqq: 1")
                         .encode(), source="t.yaml")
    assert "unknown key 'zzzqqq'" in str(refused.value)
    assert "did you mean" not in str(refused.value)
