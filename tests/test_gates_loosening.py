"""Loosening derived from the schema: every field of the thresholds models declares its
looser direction, and ``gates.loosening`` reports exactly the loosening edits.

Each case edits a thresholds mapping written out below and states, from that mapping,
the message the edit must produce; a tightening (or an edit of a field that judges
nothing) must produce none."""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from gates.adoption_decision import DecisionPlan
from gates.approval_policy import ApprovalPolicy, Approver
from gates.canary_plan import CanaryExtension, CanaryPlan, CanaryStep, LatencyTest
from gates.directions import Looser, direction_of, limit
from gates.loosening import loosenings
from gates.serving_contract import ServingContract
from gates.thresholds import (
    ChangeCriterion,
    PlatformCriteria,
    Thresholds,
    ValueCriterion,
    parse_thresholds,
)

ALICE, BOB = "a" * 64, "b" * 64


def _key(hex_char: str) -> dict:
    return {"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": hex_char * 64}}


CRITERIA = {
    "value": [
        {"name": "nan-free", "metric": "accuracy.all.nan_count", "kind": "accuracy",
         "op": "==", "value": 0},
        {"name": "error-ratio", "metric": "accuracy.hard.max_error_ratio_to_baseline",
         "kind": "accuracy", "op": "<=", "value": 2.0},
        {"name": "cosine", "metric": "model.min_cosine_similarity", "kind": "accuracy",
         "op": ">=", "value": 0.999},
    ],
    "change": [
        {"name": "speedup", "metric": "latency.p50_s", "kind": "speed", "against": "baseline",
         "better": "lower", "min_improvement": 1.2},
        {"name": "vs-production", "metric": "latency.p50_s", "kind": "speed",
         "against": "production", "better": "lower", "max_regression": 1.1},
        {"name": "error-vs-production", "metric": "accuracy.all.max_error_ratio_to_baseline",
         "kind": "accuracy", "against": "production", "better": "lower",
         "max_regression": 1.25, "floor": 1.0},
        {"name": "memory", "metric": "memory.peak_bytes", "kind": "memory", "native_only": True,
         "against": "baseline", "better": "lower", "max_regression": 1.0},
    ],
}
BASE = {
    "schema_version": 2, "profile": "strict", "description": "the reference profile",
    "not_assessed_blocks_promotion": True, "min_cases_per_category": 4,
    "platforms": {p: copy.deepcopy(CRITERIA) for p in ("tpu", "gpu", "cpu")},
    "canary": {
        "steps": [{"name": "s5", "traffic_fraction": 0.05, "requests": 200},
                  {"name": "s50", "traffic_fraction": 0.5, "requests": 400}],
        "max_error_count": 0, "max_nan_count": 0, "max_output_drift": 1.0e-3,
        "latency": {"test": "mannwhitneyu", "alternative": "greater", "alpha": 0.05,
                    "min_slowdown_ratio": 1.05},
        "max_memory_growth_bytes": 1000000,
    },
    "approval": {
        "required_for": ["shadow->canary", "canary->production"], "timeout_s": 3600,
        "auto_approve": False, "require_signed": True,
        "approvers": [{"name": "alice", "keyid": ALICE, "public_key": _key("a")}],
    },
}


def _parsed(data: dict) -> Thresholds:
    return parse_thresholds(yaml.safe_dump(data).encode())


def _edited(edit: Callable[[dict], None]) -> Thresholds:
    data = copy.deepcopy(BASE)
    edit(data)
    return _parsed(data)


def _cpu(kind: str, name: str) -> Callable[[Callable[[dict], None]], Callable[[dict], None]]:
    """An edit of one criterion of the cpu platform."""
    def wrap(change: Callable[[dict], None]) -> Callable[[dict], None]:
        def edit(data: dict) -> None:
            (criterion,) = [c for c in data["platforms"]["cpu"][kind] if c["name"] == name]
            change(criterion)
        return edit
    return wrap


def _set(**values) -> Callable[[dict], None]:
    return lambda d: d.update(values)


def _canary(**values) -> Callable[[dict], None]:
    return lambda data: data["canary"].update(values)


def _latency(**values) -> Callable[[dict], None]:
    return lambda data: data["canary"]["latency"].update(values)


def _approval(**values) -> Callable[[dict], None]:
    return lambda data: data["approval"].update(values)


def _serving(**values) -> Callable[[dict], None]:
    return lambda data: data.setdefault("serving", {}).update(values)


def _step(name: str, **values) -> Callable[[dict], None]:
    return lambda data: [s.update(values) for s in data["canary"]["steps"] if s["name"] == name]


def _remove(kind: str, name: str) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        data["platforms"]["cpu"][kind] = [c for c in data["platforms"]["cpu"][kind]
                                          if c["name"] != name]
    return edit


def _swap_bound(criterion: dict) -> None:
    del criterion["min_improvement"]
    criterion["max_regression"] = 1.0


LOOSENINGS = [
    # change criteria
    ("min_improvement lowered", _cpu("change", "speedup")(_set(min_improvement=1.1)),
     ["cpu/speedup: min_improvement 1.2 -> 1.1"]),
    ("max_regression raised", _cpu("change", "vs-production")(_set(max_regression=1.3)),
     ["cpu/vs-production: max_regression 1.1 -> 1.3"]),
    ("floor raised", _cpu("change", "error-vs-production")(_set(floor=2.0)),
     ["cpu/error-vs-production: floor 1 -> 2"]),
    ("compares against another reference", _cpu("change", "vs-production")(
        _set(against="baseline")), ["cpu/vs-production: against production -> baseline"]),
    ("direction of better flipped", _cpu("change", "speedup")(_set(better="higher")),
     ["cpu/speedup: better lower -> higher"]),
    ("another metric", _cpu("change", "vs-production")(_set(metric="latency.p99_s")),
     ["cpu/vs-production: metric latency.p50_s -> latency.p99_s"]),
    ("bound exchanged (1.2x better -> no worse)", _cpu("change", "speedup")(_swap_bound),
     ["cpu/speedup: min_improvement 1.2 -> unset", "cpu/speedup: max_regression unset -> 1"]),
    ("judged natively only", _cpu("change", "error-vs-production")(_set(native_only=True)),
     ["cpu/error-vs-production: native_only false -> true"]),
    ("memory judged in interpret mode too", _cpu("change", "memory")(_set(native_only=False)),
     ["cpu/memory: native_only true -> false"]),
    ("kind changed", _cpu("change", "memory")(_set(kind="accuracy")),
     ["cpu/memory: kind memory -> accuracy"]),
    # value criteria
    ("<= bound raised", _cpu("value", "error-ratio")(_set(value=3.0)),
     ["cpu/error-ratio: accuracy.hard.max_error_ratio_to_baseline <= 2 -> 3"]),
    (">= bound lowered", _cpu("value", "cosine")(_set(value=0.99)),
     ["cpu/cosine: model.min_cosine_similarity >= 0.999 -> 0.99"]),
    ("== bound raised", _cpu("value", "nan-free")(_set(value=1)),
     ["cpu/nan-free: accuracy.all.nan_count == 0 -> 1"]),
    ("== bound lowered", _cpu("value", "nan-free")(_set(value=-1)),
     ["cpu/nan-free: accuracy.all.nan_count == 0 -> -1"]),
    ("op changed", _cpu("value", "error-ratio")(_set(op=">=")),
     ["cpu/error-ratio: op <= -> >="]),
    ("value criterion removed", _remove("value", "cosine"), ["cpu/cosine: removed"]),
    ("change criterion removed", _remove("change", "memory"), ["cpu/memory: removed"]),
    ("criterion renamed", _cpu("value", "cosine")(_set(name="cosine2")),
     ["cpu/cosine: removed"]),
    # profile-wide
    ("min_cases_per_category lowered", _set(min_cases_per_category=1),
     ["min_cases_per_category 4 -> 1"]),
    ("not_assessed no longer blocks", _set(not_assessed_blocks_promotion=False),
     ["not_assessed_blocks_promotion true -> false"]),
    # canary
    ("max_error_count raised", _canary(max_error_count=3), ["canary.max_error_count 0 -> 3"]),
    ("max_nan_count raised", _canary(max_nan_count=2), ["canary.max_nan_count 0 -> 2"]),
    ("max_output_drift raised", _canary(max_output_drift=1.0e-2),
     ["canary.max_output_drift 0.001 -> 0.01"]),
    ("max_memory_growth_bytes raised", _canary(max_memory_growth_bytes=2000000),
     ["canary.max_memory_growth_bytes 1000000 -> 2000000"]),
    ("alpha lowered", _latency(alpha=0.01), ["canary.latency.alpha 0.05 -> 0.01"]),
    ("min_slowdown_ratio raised", _latency(min_slowdown_ratio=1.5),
     ["canary.latency.min_slowdown_ratio 1.05 -> 1.5"]),
    ("a step removed", lambda d: d["canary"]["steps"].pop(0), ["canary.steps[s5]: removed"]),
    ("fewer requests in a step", _step("s50", requests=300),
     ["canary.steps[s50].requests 400 -> 300"]),
    ("traffic fraction raised", _step("s5", traffic_fraction=0.1),
     ["canary.steps[s5].traffic_fraction 0.05 -> 0.1"]),
    ("traffic fraction lowered", _step("s50", traffic_fraction=0.25),
     ["canary.steps[s50].traffic_fraction 0.5 -> 0.25"]),
    # serving contract: narrower is looser (the kernel must run less)
    ("a served dtype dropped", _serving(dtypes=["float32", "bfloat16"]),
     ["serving.dtypes: float16 removed"]),
    ("smallest head_dim raised", _serving(min_head_dim=64), ["serving.min_head_dim 1 -> 64"]),
    ("largest head_dim set", _serving(max_head_dim=256), ["serving.max_head_dim unset -> 256"]),
    ("shortest sequence raised", _serving(min_seq=1024), ["serving.min_seq 1 -> 1024"]),
    ("longest sequence set", _serving(max_seq=4096), ["serving.max_seq unset -> 4096"]),
    ("the serving model in another dtype", _serving(model_dtype="bfloat16"),
     ["serving.model_dtype float32 -> bfloat16"]),
    ("bf16 long sequences only", _serving(dtypes=["bfloat16"], model_dtype="bfloat16",
                                          min_head_dim=64, max_head_dim=256, min_seq=1024),
     ["serving.dtypes: float32 removed", "serving.dtypes: float16 removed",
      "serving.min_head_dim 1 -> 64", "serving.max_head_dim unset -> 256",
      "serving.min_seq 1 -> 1024", "serving.model_dtype float32 -> bfloat16"]),
    # approval
    ("required_for shrinks", _approval(required_for=["shadow->canary"]),
     ["approval.required_for: canary->production removed"]),
    ("auto_approve on", _approval(auto_approve=True, auto_approve_reason="demo"),
     ["approval.auto_approve false -> true"]),
    ("require_signed off", _approval(require_signed=False),
     ["approval.require_signed true -> false"]),
    ("a new approver", lambda d: d["approval"]["approvers"].append(
        {"name": "bob", "keyid": BOB, "public_key": _key("b")}),
     [f"approval.approvers[{BOB}]: added"]),
    ("an approver's key replaced", lambda d: d["approval"]["approvers"][0].update(
        public_key=_key("c")), [f"approval.approvers[{ALICE}].public_key changed"]),
    ("an approver's key id listed twice", lambda d: d["approval"]["approvers"].append(
        {"name": "mallory", "keyid": ALICE, "public_key": _key("m")}),
     ["approval.approvers: a keyid repeated"]),
]


@pytest.mark.parametrize(("edit", "expected"), [c[1:] for c in LOOSENINGS],
                         ids=[c[0] for c in LOOSENINGS])
def test_each_loosening_is_reported_in_words(edit, expected):
    assert sorted(loosenings(_parsed(BASE), _edited(edit))) == sorted(expected)


def test_a_loosening_on_each_platform_is_reported_per_platform():
    def edit(data):
        for criteria in data["platforms"].values():
            criteria["value"][1]["value"] = 4.0
    assert sorted(loosenings(_parsed(BASE), _edited(edit))) == [
        f"{p}/error-ratio: accuracy.hard.max_error_ratio_to_baseline <= 2 -> 4"
        for p in ("cpu", "gpu", "tpu")]


def _retest(kind: str, alternative: str) -> Thresholds:
    """The base profile with another kind of latency test (the schema knows one kind
    today, so a later one is built in code, unvalidated)."""
    t = _parsed(BASE)
    latency = t.canary.latency.model_copy(update={"test": kind, "alternative": alternative})
    return t.model_copy(update={"canary": t.canary.model_copy(update={"latency": latency})})


def test_a_change_of_test_kind_needs_a_named_approval():
    assert loosenings(_parsed(BASE), _retest("ttest", "greater")) == [
        "canary.latency.test mannwhitneyu -> ttest"]
    assert loosenings(_parsed(BASE), _retest("mannwhitneyu", "two-sided")) == [
        "canary.latency.alternative greater -> two-sided"]


TIGHTENINGS = [
    ("min_improvement raised", _cpu("change", "speedup")(_set(min_improvement=1.5))),
    ("max_regression lowered", _cpu("change", "vs-production")(_set(max_regression=1.05))),
    ("floor lowered", _cpu("change", "error-vs-production")(_set(floor=0.5))),
    ("<= bound lowered", _cpu("value", "error-ratio")(_set(value=1.5))),
    (">= bound raised", _cpu("value", "cosine")(_set(value=0.9999))),
    ("a criterion added", lambda d: d["platforms"]["gpu"]["value"].append(
        {"name": "inf-free", "metric": "accuracy.all.inf_count", "kind": "accuracy",
         "op": "==", "value": 0})),
    ("speed default made explicit", _cpu("change", "speedup")(_set(native_only=True))),
    ("min_cases raised", _set(min_cases_per_category=8)),
    ("not_assessed now blocks (already on), profile and description renamed",
     _set(profile="strict-2", description="renamed")),
    ("canary limits tightened", _canary(max_output_drift=1.0e-4, max_memory_growth_bytes=10)),
    ("alpha raised, slowdown ratio lowered", _latency(alpha=0.1, min_slowdown_ratio=1.0)),
    ("more requests and a step added", lambda d: d["canary"].update(steps=[
        {"name": "s5", "traffic_fraction": 0.05, "requests": 400},
        {"name": "s25", "traffic_fraction": 0.25, "requests": 400},
        {"name": "s50", "traffic_fraction": 0.5, "requests": 800}])),
    ("approval required for one more transition", _approval(
        required_for=["candidate->shadow", "shadow->canary", "canary->production"])),
    ("an approver removed, the timeout changed", _approval(approvers=[], timeout_s=60)),
    ("an approver renamed", lambda d: d["approval"]["approvers"][0].update(name="alice b.")),
]


@pytest.mark.parametrize("edit", [c[1] for c in TIGHTENINGS], ids=[c[0] for c in TIGHTENINGS])
def test_tightenings_and_names_report_nothing(edit):
    assert loosenings(_parsed(BASE), _edited(edit)) == []


def test_a_canary_extension_set_unset_or_shortened_needs_approval():
    """Setting or unsetting the extension changes the passing rule (bound on the noise or
    power at the measured noise): another test. Fewer or smaller extra looks take power
    from a noisy canary, as fewer requests in a step do."""
    from pathlib import Path

    local = Path(__file__).resolve().parents[1] / "thresholds" / "local-dry-run.yaml"
    with_extension = parse_thresholds(local.read_bytes())

    def extended(extend):
        canary = with_extension.canary.model_copy(update={"extend": extend})
        return with_extension.model_copy(update={"canary": canary})

    bare = extended(None)
    assert loosenings(bare, with_extension) == ["canary.extend unset -> set"]
    assert loosenings(with_extension, bare) == ["canary.extend set -> unset"]
    shorter = extended(CanaryExtension(max_steps=2, requests=100))
    assert sorted(loosenings(with_extension, shorter)) == [
        "canary.extend.max_steps 6 -> 2", "canary.extend.requests 200 -> 100"]
    assert loosenings(with_extension, extended(CanaryExtension(max_steps=8, requests=400))) == []


def test_a_wider_serving_contract_is_a_tightening():
    narrow = {"dtypes": ["bfloat16"], "model_dtype": "bfloat16", "min_head_dim": 64,
              "max_head_dim": 128, "min_seq": 1024, "max_seq": 4096}
    wide = {"dtypes": ["bfloat16", "float16"], "model_dtype": "bfloat16", "min_head_dim": 32,
            "max_head_dim": 256, "min_seq": 512, "max_seq": 8192}
    old, new = _parsed(BASE | {"serving": narrow}), _parsed(BASE | {"serving": wide})
    assert loosenings(old, new) == []
    assert sorted(loosenings(new, old)) == sorted([
        "serving.dtypes: float16 removed", "serving.min_head_dim 32 -> 64",
        "serving.max_head_dim 256 -> 128", "serving.min_seq 512 -> 1024",
        "serving.max_seq 8192 -> 4096"])


def test_fewer_masks_and_no_model_check_are_loosenings_and_a_mask_is_served_or_not():
    from gates.thresholds import parse_thresholds

    both = {"dtypes": ["bfloat16"], "model_dtype": "bfloat16"}
    old = _parsed(BASE | {"serving": both})
    new = _parsed(BASE | {"serving": both | {"masks": ["full"]}})
    assert loosenings(old, new) == ["serving.masks: causal removed"]
    assert loosenings(new, old) == []
    full = new.serving
    assert full.outside("bfloat16", 128, 4096, 4096, causal=True) == (
        "causal mask not served ['full']")
    assert full.serves("bfloat16", 128, 4096, 4096) and full.outside(
        "bfloat16", 128, 4096, 4096, causal=False) is None
    assert old.serving.outside("bfloat16", 128, 4096, 4096, causal=True) is None
    assert full.describe().endswith(", full masks; model bfloat16")
    with pytest.raises(ValueError, match="lists a mask twice"):
        ServingContract(masks=["full", "full"])
    # the shipped encoder registration, and the same serving MiniLM as well
    text = HD128.read_text()
    encoder = parse_thresholds(text.encode())
    with_minilm = parse_thresholds(text.replace("model_check: false", "model_check: true")
                                   .encode())
    assert loosenings(with_minilm, encoder) == ["serving.model_check true -> false"]
    assert loosenings(encoder, with_minilm) == []
    assert encoder.serving.describe().endswith(", full masks; no MiniLM check")


def test_a_profile_without_a_contract_serves_everything():
    serving = _parsed(BASE).serving
    assert serving == ServingContract()
    assert serving.serves("float16", 256, 1, 131072) and serving.model_dtype == "float32"
    bf16 = ServingContract(dtypes=["bfloat16"], model_dtype="bfloat16", min_head_dim=64,
                           max_head_dim=256, min_seq=1024)
    assert bf16.serves("bfloat16", 128, 1, 1024)  # a decode call over 1024 keys
    assert bf16.outside("float32", 128, 1024, 1024) == "dtype float32 not served ['bfloat16']"
    assert bf16.outside("bfloat16", 32, 2048, 2048) == "head_dim 32 outside 64..256"
    assert bf16.outside("bfloat16", 64, 512, 512) == "sequence 512 outside >= 1024"
    with pytest.raises(ValueError, match="model_dtype float32 is not a served dtype"):
        ServingContract(dtypes=["bfloat16"])
    with pytest.raises(ValueError, match="max_head_dim 32 < min_head_dim 64"):
        ServingContract(min_head_dim=64, max_head_dim=32)


def test_an_unchanged_profile_reports_nothing_and_the_reverse_of_a_loosening_does():
    base = _parsed(BASE)
    assert loosenings(base, base) == []
    loose = _edited(_canary(max_nan_count=2))
    assert loosenings(loose, base) == []  # going back is a tightening
    assert loosenings(base, loose) == ["canary.max_nan_count 0 -> 2"]


# --- every field declares its direction ------------------------------------------------

HD128 = Path(__file__).resolve().parents[1] / "thresholds" / "adoption-longdoc-hd128.yaml"

SCHEMA_MODELS = {Thresholds, CanaryPlan, LatencyTest, CanaryStep, CanaryExtension, DecisionPlan,
                 ApprovalPolicy, Approver,
                 PlatformCriteria, ValueCriterion, ChangeCriterion, ServingContract}


def _models_in(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _walk(root: type[BaseModel]) -> tuple[set[type[BaseModel]], list[str]]:
    """Every model reachable from ``root`` through its fields, and each field (as
    ``Model.field``) that declares no looser direction."""
    seen: set[type[BaseModel]] = set()
    undeclared: list[str] = []
    todo = [root]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            if direction_of(field) is None:
                undeclared.append(f"{model.__name__}.{name}")
            todo += _models_in(field.annotation)
    return seen, undeclared


def test_every_field_of_the_schema_declares_its_looser_direction():
    models, undeclared = _walk(Thresholds)
    assert models == SCHEMA_MODELS
    assert undeclared == [], (
        "declare each field's looser direction with gates.directions.limit: "
        f"{undeclared}")


def test_a_field_added_without_a_direction_is_caught():
    class JudgedCanary(CanaryPlan):
        inconclusive_policy: str = "fail"  # the canary judge's plan, added carelessly

    class Later(Thresholds):
        canary: JudgedCanary = limit(Looser.NESTED)

    _, undeclared = _walk(Later)
    assert undeclared == ["JudgedCanary.inconclusive_policy"]
    # and until it is declared, the loosening rule treats any change of it as looser
    data = copy.deepcopy(BASE) | {"canary": BASE["canary"] | {"inconclusive_policy": "fail"}}
    old = Later.model_validate(data)
    new = Later.model_validate(data | {"canary": data["canary"] | {"inconclusive_policy": "pass"}})
    assert loosenings(old, new) == ["canary.inconclusive_policy fail -> pass"]


def test_declarations_are_complete_where_the_walk_needs_them():
    for model in SCHEMA_MODELS:
        for name, field in model.model_fields.items():
            direction = direction_of(field)
            assert direction is not None
            if direction.looser is Looser.NOT_A_LIMIT:
                assert direction.why, f"{model.__name__}.{name}: not_a_limit needs a why"
            origin = typing.get_origin(field.annotation)
            if origin is list and _models_in(field.annotation):
                assert direction.looser in (Looser.FEWER, Looser.MORE) and direction.key, (
                    f"{model.__name__}.{name}: a list of models is matched by a declared key")
            if _models_in(field.annotation) and origin not in (list, dict, types.UnionType):
                assert direction.looser is Looser.NESTED, f"{model.__name__}.{name}"
    assert Thresholds.model_json_schema()["$defs"]["CanaryPlan"]["properties"][
        "max_nan_count"]["looser"] == "higher"


def test_a_not_a_limit_without_a_reason_is_refused_at_definition():
    with pytest.raises(TypeError, match="why"):
        limit(Looser.NOT_A_LIMIT)
    with pytest.raises(TypeError, match="why"):
        limit(Looser.HIGHER, why="a limit has no excuse")


def test_no_model_check_refuses_model_criteria_and_a_registration_without_a_workload():
    from gates.thresholds import parse_thresholds

    text = HD128.read_text()
    assert parse_thresholds(text.encode()).serving.model_check is False  # as shipped
    cosine = ('      - {name: embedding-cosine, metric: model.min_cosine_similarity, '
              'kind: accuracy, op: ">=", value: 0.99}\n')
    anchor = "      - {name: nan-free,"
    judged = text.replace(anchor, cosine + anchor, 1)
    with pytest.raises(ValueError, match=r"model_check is false.*tpu/embedding-cosine"):
        parse_thresholds(judged.encode())
    data = yaml.safe_load(text)
    del data["canary"]["workload"], data["decision"]
    data["canary"]["latency"].pop("noise_within_buckets")
    with pytest.raises(ValueError, match="model_check false needs canary.workload"):
        parse_thresholds(yaml.safe_dump(data).encode())
