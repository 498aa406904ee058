"""The dispatch policy on a CPU host, with stand-in evidence and stand-in kernels: the
median's interval, the partition of the space, the rule's choice per bucket, the
fingerprint, the audit that re-derives every choice from its evidence, the dispatch
kernel's routing (checked against float64 attention) and the evidence tool end to end.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels.contract import validate
from kernels.dispatch_audit import PolicyError, audit_policy, load_policy
from kernels.dispatch_kernel import DispatchConfig, DispatchKernel
from kernels.dispatch_policy import (
    BucketEvidence,
    DispatchPolicy,
    Evidence,
    KernelEvidence,
    Rule,
    ShapeTiming,
    derive_policy,
)
from kernels.dispatch_space import (
    DEFAULT_GRID,
    Bucket,
    BucketGrid,
    CoverageError,
    IntRange,
    Region,
    check_partition,
)
from kernels.kernel import Kernel
from kernels.naive import NaiveKernel
from kernels.reference import attention_reference
from kernels.registry import registered
from kernels.shapes import AttentionShape
from kernels.timing import median_interval
from kernels.tools import dispatch_evidence
from kernels.xla import XlaKernel

SPACE = Region(dtypes=("float32",), causal=(False,))
"""A small space for hand-made buckets: float32, non-causal, every size."""


def test_the_median_interval_is_the_order_statistics_its_coverage_allows():
    samples = [float(x) for x in (9, 1, 8, 2, 7, 3, 6, 4, 5, 10, 11)]  # 1..11, shuffled
    low, high, coverage = median_interval(samples, 0.95)
    # n = 11: P(B(11, 1/2) < 2) = 12/2048 <= 0.025 < P(B < 3) = 67/2048, so k = 2
    assert (low, high) == (2.0, 10.0)
    assert coverage == pytest.approx(1 - 2 * 12 / 2048)
    low, high, coverage = median_interval([3.0, 1.0, 2.0], 0.95)  # too few: [min, max]
    assert (low, high) == (1.0, 3.0)
    assert coverage == pytest.approx(1 - 2 ** (1 - 3))
    assert median_interval(samples, 0.5)[0] > 2.0  # a lower confidence, a narrower interval


@pytest.mark.parametrize("samples, confidence, match", [
    ([], 0.95, "at least one sample"), ([1.0], 1.0, r"confidence must lie in \(0, 1\)")])
def test_the_median_interval_refuses_what_it_cannot_bound(samples, confidence, match):
    with pytest.raises(ValueError, match=match):
        median_interval(samples, confidence)




def _split(name: str, q_len: IntRange) -> Bucket:
    return Bucket(name=name, dtypes=("float32",), causal=(False,), q_len=q_len)


def test_buckets_that_split_the_space_exactly_once_are_accepted():
    check_partition(SPACE, [_split("short", IntRange(hi=64)), _split("long", IntRange(lo=64))])


@pytest.mark.parametrize("buckets, match", [
    ([_split("short", IntRange(hi=65)), _split("long", IntRange(lo=64))],
     r"'short' and 'long' overlap: both cover float32 full head_dim \[1, inf\) "
     r"q_len \[64, 65\)"),
    ([_split("short", IntRange(hi=64)), _split("long", IntRange(lo=65))],
     r"no bucket covers float32 full head_dim \[1, inf\) q_len \[64, 65\)"),
    ([_split("short", IntRange(hi=64)), _split("long", IntRange(lo=64)),
      Bucket(name="causal", dtypes=("float32",), causal=(True,))],
     r"'causal' .* reaches outside the policy's space"),
    ([_split("all", IntRange()), _split("all", IntRange(lo=2))], r"\['all'\] appear twice"),
])
def test_buckets_that_overlap_leave_a_gap_or_reach_outside_are_refused(buckets, match):
    with pytest.raises(CoverageError, match=match):
        check_partition(SPACE, buckets)


def test_the_default_grid_splits_by_dtype_causal_head_dim_and_at_1024_and_8192_tokens():
    buckets = DEFAULT_GRID.buckets()
    check_partition(DEFAULT_GRID.space, buckets)
    assert len(buckets) == 3 * 2 * 3 * 3 * 3  # dtypes, causal, head_dim, q_len, kv_len
    ranges = DEFAULT_GRID.axis_ranges()
    assert [r.lo for r in ranges["q_len"]] == [1, 1024, 8192]
    assert [r.lo for r in ranges["kv_len"]] == [1, 1024, 8192]
    assert [(r.lo, r.hi) for r in ranges["head_dim"]] == [(1, 65), (65, 129), (129, None)]

    def bucket_of(**call):
        (found,) = [b for b in buckets if b.contains(**call)]
        return found.name

    call = {"dtype": "bfloat16", "causal": False, "head_dim": 64, "kv_len": 512, "batch": 1}
    assert bucket_of(**call, q_len=1023) != bucket_of(**call, q_len=1024)
    assert bucket_of(**call, q_len=8191) != bucket_of(**call, q_len=8192)
    assert bucket_of(**call, q_len=1024) == bucket_of(**call, q_len=8191)
    assert bucket_of(**{**call, "head_dim": 128}, q_len=64) != bucket_of(**call, q_len=64)


@pytest.mark.parametrize("fields, match", [
    ({"seq_cuts": (8192, 1024)}, "seq_cuts must be strictly increasing"),
    ({"head_dim_cuts": (1,)}, r"head_dim_cuts \[1\] lie outside the space's head_dim"),
    ({"space": Region(q_len=IntRange(hi=2048))},
     r"seq_cuts \[8192\] lie outside the space's q_len \[1, 2048\)"),
])
def test_a_grid_with_cuts_that_split_nothing_is_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        BucketGrid(**fields)


# --------------------------------------------------------------------------- the policy

GRID = BucketGrid(space=SPACE, head_dim_cuts=(48,), seq_cuts=(32,), split_kv_len=False)
"""Four buckets: head_dim below 48 or not, q_len below 32 or not (kv_len whole)."""
SHAPES = {(d, s): AttentionShape(batch=1, q_len=s, kv_len=s, num_heads=2, num_kv_heads=2,
                                 head_dim=d) for d in (32, 64) for s in (16, 64)}
"""One measured shape per bucket of :data:`GRID`: (head_dim, q_len) -> shape."""


def _bucket_at(head_dim: int, seq: int) -> Bucket:
    (bucket,) = [b for b in GRID.buckets() if b.contains_shape(SHAPES[head_dim, seq])]
    return bucket


def _timing(shape: AttentionShape, median: float, spread: float = 0.01) -> ShapeTiming:
    return ShapeTiming(shape=shape, median_s=median, low_s=median * (1 - spread),
                       high_s=median * (1 + spread), coverage=0.988, repeats=11)


def make_evidence(measured: dict[tuple[int, int], dict[str, float | str]],
                  spread: float = 0.01) -> Evidence:
    """Stand-in evidence over :data:`GRID`: per bucket (by its shape's (head_dim, q_len)),
    kernel -> median seconds or the reason it refused; buckets not given: xla 1 ms."""
    buckets = []
    for key, shape in SHAPES.items():
        kernels = []
        for name, value in measured.get(key, {"xla": 1e-3}).items():
            kernels.append(KernelEvidence(kernel=name, refused=value) if isinstance(value, str)
                           else KernelEvidence(kernel=name,
                                               timings=(_timing(shape, value, spread),)))
        buckets.append(BucketEvidence(bucket=_bucket_at(*key), shapes=(shape,),
                                      kernels=tuple(kernels)))
    return Evidence(space=SPACE, device="stand-in CPU", backend="cpu",
                    method="stand-in timings", buckets=tuple(buckets))


MEASURED = {(32, 16): {"xla": 1.0e-5, "naive": 3.0e-5},   # xla clearly faster
            (32, 64): {"xla": 5.0e-5, "naive": 2.0e-5},   # naive clearly faster
            (64, 16): {"xla": 1.0e-5, "naive": 1.01e-5},  # within each other's interval
            (64, 64): {"xla": "xla refused: stand-in reason",
                       "naive": "naive refused: another reason"}}


def _choice(policy: DispatchPolicy, head_dim: int, seq: int):
    return policy.choice_for(SHAPES[head_dim, seq])


def test_the_policy_takes_the_fastest_kernel_of_each_bucket():
    policy = derive_policy(make_evidence(MEASURED), ("xla", "naive"), Rule())
    assert _choice(policy, 32, 16).kernel == "xla"
    assert _choice(policy, 32, 64).kernel == "naive"
    assert _choice(policy, 32, 64).regret == 0.0
    summaries = {s.kernel: s for s in _choice(policy, 32, 64).summaries}
    assert summaries["xla"].ratio_to_best == pytest.approx(2.5)
    assert _choice(policy, 64, 16).kernel == "xla"  # tied: no priority, the fastest
    assert policy.kernels() == ("xla", "naive")


def test_a_tie_within_the_intervals_goes_to_the_first_in_priority_and_only_a_tie():
    policy = derive_policy(make_evidence(MEASURED), ("xla", "naive"),
                           Rule(priority=("naive", "xla")))
    tied = _choice(policy, 64, 16)
    assert (tied.kernel, tied.best) == ("naive", "xla")
    assert tied.regret == pytest.approx(0.01)
    assert "overlaps the fastest's (xla" in tied.why
    # naive first in priority, but xla's interval lies wholly below naive's: xla
    assert _choice(policy, 32, 16).kernel == "xla"
    wide = derive_policy(make_evidence(MEASURED, spread=0.9), ("xla", "naive"),
                         Rule(priority=("naive",)))
    assert _choice(wide, 32, 16).kernel == "naive"  # intervals that wide overlap


def test_a_bucket_no_kernel_serves_keeps_no_kernel_and_every_reason():
    policy = derive_policy(make_evidence(MEASURED), ("xla", "naive", "cudnn"), Rule())
    empty = _choice(policy, 64, 64)
    assert empty.kernel is None and empty.regret is None
    for reason in ("xla refused: stand-in reason", "naive refused: another reason",
                   "cudnn: not measured in this bucket"):
        assert reason in empty.why
    assert {s.kernel: s.refused for s in _choice(policy, 32, 16).summaries}["cudnn"] == \
        "not measured in this bucket"


@pytest.mark.parametrize("candidates, rule, match", [
    (("xla", "xla"), Rule(), "distinct registry names"),
    ((), Rule(), "distinct registry names"),
    (("xla", "naive"), Rule(priority=("cudnn",)), r"priority names \['cudnn'\]"),
])
def test_derive_policy_refuses_bad_candidates(candidates, rule, match):
    with pytest.raises(ValueError, match=match):
        derive_policy(make_evidence(MEASURED), candidates, rule)


def test_evidence_whose_buckets_leave_a_gap_or_overlap_is_refused():
    evidence = make_evidence(MEASURED)
    with pytest.raises(ValueError, match="no bucket covers float32 full head_dim"):
        Evidence(**{**evidence.__dict__, "buckets": evidence.buckets[1:]})
    whole = BucketEvidence(bucket=Bucket(name="whole", dtypes=("float32",), causal=(False,)),
                           shapes=evidence.buckets[0].shapes,
                           kernels=evidence.buckets[0].kernels)
    with pytest.raises(ValueError, match="overlap"):
        Evidence(**{**evidence.__dict__, "buckets": (whole, *evidence.buckets[1:])})


def test_evidence_that_contradicts_itself_is_refused():
    shape = SHAPES[32, 16]
    with pytest.raises(ValueError, match="low_s <= median_s <= high_s"):
        ShapeTiming(shape=shape, median_s=1.0, low_s=1.1, high_s=2.0, coverage=0.9, repeats=7)
    for infinite in ({"high_s": float("inf")}, {"median_s": float("inf"), "high_s": float("inf")},
                     {"median_s": float("nan")}):  # inf/nan would rank a kernel
        with pytest.raises(ValueError, match="finite number"):
            ShapeTiming(**{"shape": shape, "median_s": 1.0, "low_s": 0.5, "high_s": 2.0,
                           "coverage": 0.9, "repeats": 7, **infinite})
    with pytest.raises(ValueError, match="timings or a refusal, exactly one"):
        KernelEvidence(kernel="xla", timings=(_timing(shape, 1e-5),), refused="no")
    with pytest.raises(ValueError, match="holds shapes outside it"):
        BucketEvidence(bucket=_bucket_at(64, 64), shapes=(shape,), kernels=())
    with pytest.raises(ValueError, match="not at the bucket's shapes"):
        BucketEvidence(bucket=_bucket_at(32, 16), shapes=(shape,), kernels=(
            KernelEvidence(kernel="xla", timings=(_timing(shape, 1e-5),) * 2),))


# --------------------------------------------------------------------------- fingerprint, audit

def _policy() -> DispatchPolicy:
    return derive_policy(make_evidence(MEASURED), ("xla", "naive"), Rule(priority=("xla",)))


def _reordered(value):
    """The same JSON value with every object's keys in reverse order."""
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(v) for v in value]
    return value


def test_the_fingerprint_ignores_layout_and_key_order():
    policy = _policy()
    data = json.loads(policy.model_dump_json())
    assert list(_reordered(data)) != list(data)
    again = DispatchPolicy.model_validate_json(json.dumps(_reordered(data), indent=3))
    assert again.fingerprint() == policy.fingerprint()
    assert derive_policy(make_evidence(MEASURED), ("xla", "naive"),
                         Rule(priority=("xla",))).fingerprint() == policy.fingerprint()


def _edits() -> list[tuple[str, dict]]:
    """(what, measured, evidence fields) for one changed measurement or record each."""
    out = []
    for key, by_kernel in MEASURED.items():
        for name, value in by_kernel.items():
            changed = value + " (edited)" if isinstance(value, str) else value * 1.0001
            out.append((f"{name} at {key}", {**MEASURED, key: {**by_kernel, name: changed}}, {}))
    return out + [("device", MEASURED, {"device": "another CPU"}),
                  ("method", MEASURED, {"method": "other timings"})]


@pytest.mark.parametrize("what, measured, fields", _edits(), ids=[e[0] for e in _edits()])
def test_the_fingerprint_moves_with_any_evidence(what, measured, fields):
    evidence = make_evidence(measured)
    evidence = Evidence(**{**evidence.__dict__, **fields})
    changed = derive_policy(evidence, ("xla", "naive"), Rule(priority=("xla",)))
    assert changed.fingerprint() != _policy().fingerprint(), what
    assert changed.evidence_sha256 != _policy().evidence_sha256, what


def _edited(policy: DispatchPolicy, bucket: tuple[int, int], kernel: str, median: float
            ) -> DispatchPolicy:
    """``policy`` as a file whose one evidence value was edited by hand afterwards."""
    data = json.loads(policy.model_dump_json())
    index = policy.buckets.index(_choice(policy, *bucket))
    (entry,) = [k for k in data["buckets"][index]["evidence"]["kernels"] if k["kernel"] == kernel]
    entry["timings"][0].update(median_s=median, low_s=median * 0.99, high_s=median * 1.01)
    return DispatchPolicy.model_validate(data)


def test_the_audit_passes_a_policy_as_derived_and_read_back(tmp_path):
    policy = _policy()
    audit_policy(policy, policy.fingerprint())
    path = tmp_path / "policy.json"
    path.write_text(policy.model_dump_json(indent=1))
    assert load_policy(path, policy.fingerprint()) == policy


def test_evidence_edited_after_signing_fails_the_audit(tmp_path):
    policy = _policy()
    signed = policy.fingerprint()
    # naive made the fastest in the bucket that chose xla: the recorded choice is now wrong
    edited = _edited(policy, (32, 16), "naive", 1e-6)
    with pytest.raises(PolicyError, match=f"not the {signed} signed"):
        audit_policy(edited, signed)
    # and with its fingerprint taken again (no signature to hold it to) the rule says so
    with pytest.raises(PolicyError, match=r"records xla, but its evidence derives naive"):
        audit_policy(edited, edited.fingerprint())
    path = tmp_path / "policy.json"
    path.write_text(edited.model_dump_json())
    with pytest.raises(PolicyError, match=r"policy\.json: bucket .* records xla"):
        load_policy(path)


def test_a_policy_is_derived_again_once_per_process_and_an_edit_never_rides_on_it(
        monkeypatch):
    from kernels import dispatch_audit

    monkeypatch.setattr(dispatch_audit, "_DERIVED", set())
    calls = []
    real = dispatch_audit.derive_policy
    monkeypatch.setattr(dispatch_audit, "derive_policy",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    policy = _policy()
    again = DispatchPolicy.model_validate_json(policy.model_dump_json(indent=2))
    audit_policy(policy, policy.fingerprint())
    audit_policy(again)  # another object, the same canonical JSON
    assert len(calls) == 1
    # an edit moves the fingerprint: derived, and refused, every time it is met
    edited = _edited(policy, (32, 16), "naive", 1e-6)
    for _ in range(2):
        with pytest.raises(PolicyError, match="records xla, but its evidence derives naive"):
            audit_policy(edited)
    assert len(calls) == 3
    # a signed fingerprint is checked before anything remembered
    with pytest.raises(PolicyError, match="changed after signing"):
        audit_policy(policy, edited.fingerprint())


def test_an_edit_that_keeps_the_choice_still_fails_the_audit():
    edited = _edited(_policy(), (32, 16), "naive", 2.9e-5)  # still slower than xla
    assert _choice(edited, 32, 16).kernel == "xla"
    with pytest.raises(PolicyError, match=r"naive's recorded summary .* is not its evidence's"):
        audit_policy(edited)


def test_a_policy_recording_other_evidence_than_it_carries_fails_the_audit():
    policy = _policy()
    forged = policy.model_copy(update={"evidence_sha256": "0" * 64})
    with pytest.raises(PolicyError, match=f"records evidence {'0' * 64}"):
        audit_policy(forged)


def test_a_policy_file_that_is_missing_or_not_a_policy_is_refused_by_name(tmp_path):
    with pytest.raises(PolicyError, match=r"nowhere\.json"):
        load_policy(tmp_path / "nowhere.json")
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 2}')
    with pytest.raises(PolicyError,
                       match=r"bad\.json is not a valid policy: space: Field required; device"):
        load_policy(path)
    path.write_text('{"schema_version": 1}')  # before capabilities and rankings were recorded
    with pytest.raises(PolicyError, match=r"schema_version: Input should be 2"):
        load_policy(path)


# --------------------------------------------------------------------------- the dispatch kernel

def _counting(base: type[Kernel]) -> Kernel:
    """A stand-in: the registered kernel ``base`` (same name, same output), counting the
    calls it serves."""

    class Counting(base):
        calls = 0

        def __call__(self, *args, **kwargs):
            type(self).calls += 1
            return super().__call__(*args, **kwargs)

    return Counting()


@pytest.fixture
def stand_ins(monkeypatch):
    """xla and naive as counting stand-ins, and the dispatch kernel of the stand-in
    policy registered (xla at (32, 16) and (64, 16), naive at (32, 64), none at (64, 64))."""
    counted = {"xla": _counting(XlaKernel), "naive": _counting(NaiveKernel)}
    for name, kernel in counted.items():
        monkeypatch.setitem(kernels.IMPLEMENTATIONS, name, kernel)
    with registered(DispatchKernel(_policy())) as dispatch:
        yield counted, dispatch


@pytest.mark.parametrize("head_dim, seq, served_by", [
    (40, 20, "xla"), (16, 33, "naive"), (48, 31, "xla")])
def test_the_dispatch_kernel_serves_each_bucket_by_its_kernel_as_float64_attention_does(
        stand_ins, head_dim, seq, served_by):
    counted, _ = stand_ins
    rng = np.random.default_rng(head_dim * 1000 + seq)  # fresh inputs, unlike the evidence's
    q, k, v = (jnp.asarray(rng.standard_normal((2, seq, 2, head_dim)), jnp.float32)
               for _ in range(3))
    before = {name: type(kernel).calls for name, kernel in counted.items()}
    out = kernels.attention(q, k, v, implementation="dispatch")
    served = {name: type(kernel).calls - before[name] for name, kernel in counted.items()}
    assert served == {n: int(n == served_by) for n in counted}
    reference = attention_reference(q, k, v)
    np.testing.assert_allclose(np.asarray(out, np.float64), reference, rtol=2e-5, atol=2e-6)
    jitted = jax.jit(lambda q, k, v: kernels.attention(q, k, v, implementation="dispatch"))
    out = jitted(q, k, v)  # routed when traced: the same kernel, compiled
    assert type(counted[served_by]).calls - before[served_by] == 2
    np.testing.assert_allclose(np.asarray(out, np.float64), reference, rtol=2e-5, atol=2e-6)


def test_the_dispatch_kernel_refuses_a_bucket_without_kernel_and_calls_outside_its_space(
        stand_ins):
    q = jnp.ones((1, 40, 2, 64), jnp.float32)
    with pytest.raises(NotImplementedError, match=r"has no kernel: no candidate serves it: "
                                                  r"xla: xla refused: stand-in reason"):
        kernels.attention(q, q, q, implementation="dispatch")
    q = jnp.ones((1, 8, 2, 32), jnp.bfloat16)
    with pytest.raises(NotImplementedError, match=r"space .* does not hold bfloat16 d32"):
        kernels.attention(q, q, q, implementation="dispatch")


def test_the_dispatch_config_names_its_policy_and_refuses_another(stand_ins):
    _, dispatch = stand_ins
    spec, _, _ = validate(*SHAPES[32, 16].structs(), causal=False)
    assert kernels.resolve("dispatch", spec).config == DispatchConfig(
        policy_sha256=_policy().fingerprint())
    with pytest.raises(ValueError, match=f"serves the policy {dispatch.fingerprint}; the "
                                         f"config names {'a' * 64}"):
        kernels.resolve("dispatch", spec, config={"policy_sha256": "a" * 64})
    with pytest.raises(ValueError, match="dispatch takes block sizes"):
        kernels.resolve("dispatch", spec, config={"block_q": 64})


def test_the_dispatch_kernel_serves_only_an_audited_policy(tmp_path):
    edited = _edited(_policy(), (32, 16), "naive", 1e-6)
    with pytest.raises(PolicyError, match="records xla, but its evidence derives naive"):
        DispatchKernel(edited)
    path = tmp_path / "policy.json"
    path.write_text(_policy().model_dump_json())
    with pytest.raises(PolicyError, match="not the 0+ signed"):
        DispatchKernel.from_file(path, "0" * 64)
    assert DispatchKernel.from_file(path, _policy().fingerprint()).policy == _policy()


def test_auto_is_unchanged_by_a_registered_dispatch_kernel(monkeypatch):
    assert "dispatch" not in kernels.registry.BUILTIN
    spec, _, _ = validate(*SHAPES[32, 16].structs(), causal=False)
    before = (kernels.api.auto_order("cpu"), kernels.resolve("auto", spec, "cpu").name)
    with registered(DispatchKernel(_policy())) as dispatch:
        assert (kernels.api.auto_order("cpu"), kernels.resolve("auto", spec, "cpu").name) \
            == before
        assert dispatch.is_native("tpu")
        monkeypatch.setattr(NaiveKernel, "native_platforms", ("cpu", "gpu"))
        assert dispatch.is_native("cpu") and not dispatch.is_native("tpu")  # naive serves


# --------------------------------------------------------------------------- the evidence tool

def test_the_evidence_tool_measures_every_bucket_and_writes_an_audited_policy(tmp_path, capsys):
    out = tmp_path / "run"
    code = dispatch_evidence.main(["--out", str(out), "--quick", "--dtypes", "float32",
                                   "--causal", "full", "--kernels", "xla,naive,cudnn",
                                   "--priority", "naive", "--repeats", "3"])
    assert code == 0
    evidence = Evidence.model_validate_json((out / "evidence.json").read_text())
    policy = load_policy(out / "policy.json")  # audited: re-derived from its evidence
    assert policy == derive_policy(evidence, ("xla", "naive", "cudnn"),
                                   Rule(priority=("naive",)))
    assert policy.backend == "cpu" and "3 repeats" in policy.method
    assert len(policy.buckets) == 8  # float32, full; head_dim, q_len, kv_len each cut once
    check_partition(policy.space, [b.bucket for b in policy.buckets])
    for choice in policy.buckets:
        assert choice.kernel in ("xla", "naive"), choice.why
        assert all(choice.bucket.contains_shape(s) for s in choice.evidence.shapes)
        timed = {k.kernel: k for k in choice.evidence.kernels}
        assert [t.shape for t in timed["xla"].timings] == list(choice.evidence.shapes)
        assert all(t.low_s <= t.median_s <= t.high_s and t.repeats == 3
                   for k in ("xla", "naive") for t in timed[k].timings)
        assert "cudnn needs an NVIDIA GPU" in timed["cudnn"].refused
    table = capsys.readouterr().out
    assert table.count("-> ") == 8 and "   * " in table and policy.fingerprint() in table


def test_the_evidence_tool_refuses_a_bucket_it_would_not_measure_before_timing(tmp_path):
    with pytest.raises(ValueError, match=r"bucket 'float32 full d\[1, 48\) q\[1, 32\) "
                                         r"kv\[32, inf\) b\[1, inf\)': no measured kv_len "
                                         r"of \(16,\) lies in \[32, inf\)"):
        dispatch_evidence.main(["--out", str(tmp_path), "--quick", "--dtypes", "float32",
                                "--causal", "full", "--seqs", "16"])
    assert not list(tmp_path.iterdir())


def test_a_policy_naming_a_kernel_this_installation_lacks_or_a_routing_name_is_refused(tmp_path):
    # Audited against its own evidence such a policy is consistent; served, its bucket would
    # fail at the first call (an unknown name) or loop (a name that routes through a policy).
    ghost = make_evidence({key: {"ghost": v["xla"]} if isinstance(v.get("xla"), float) else v
                           for key, v in MEASURED.items()})
    declared = {"ghost": XlaKernel().capability, "naive": NaiveKernel().capability}
    policy = derive_policy(ghost, ("ghost", "naive"), Rule(priority=("ghost",)), declared)
    path = tmp_path / "policy.json"
    path.write_text(policy.model_dump_json(indent=1))
    audit_policy(policy, policy.fingerprint())  # consistent with itself
    with pytest.raises(PolicyError, match=r"does not have: \['ghost'\]"):
        load_policy(path, policy.fingerprint())
    routed = make_evidence({key: {"dispatch": v["xla"]} if isinstance(v.get("xla"), float)
                            else v for key, v in MEASURED.items()})
    with pytest.raises(ValueError, match="not \\['dispatch'\\]"):
        derive_policy(routed, ("dispatch", "naive"), Rule(priority=("dispatch",)),
                      {"dispatch": XlaKernel().capability, "naive": NaiveKernel().capability})
