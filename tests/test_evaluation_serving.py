"""Replayed traffic: what the canary's latency test is given to compare.

Same kernel on both sides must not look slower because of *which* requests the
candidate drew or *when* the host was busy: the latency test compares both sides on
the same requests, timed back to back, in alternating order."""

from __future__ import annotations

import numpy as np
import pytest

from evaluation import serving
from evaluation.recorded_traffic import Request
from gates.canary import analyse_canary_step
from gates.canary_plan import CanaryPlan, CanaryStep, LatencyTest


class _Clock:
    """A host whose load comes and goes: requests served while ``busy`` take 5× longer."""

    def __init__(self) -> None:
        self.busy = False
        self.calls: list[tuple[str, str]] = []


class _SameKernel:
    """Latency grows with the text's length (as padded attention does) and with load."""

    def __init__(self, name: str, clock: _Clock) -> None:
        self.name, self.clock = name, clock

    def embed(self, texts):
        self.clock.calls.append((self.name, texts[0]))
        latency = 1e-4 * len(texts[0]) * (5.0 if self.clock.busy else 1.0)
        return np.ones((1, 8), dtype=np.float32), latency


def _requests(n: int, rng: np.random.Generator) -> list[Request]:
    lengths = rng.integers(10, 400, size=n)
    return [Request(request_id=f"r{i}", text="x" * int(length), source="doc")
            for i, length in enumerate(lengths)]


def _plan() -> CanaryPlan:
    step = CanaryStep(name="canary-25pct", traffic_fraction=0.25, requests=80)
    return CanaryPlan(steps=[step], max_error_count=0, max_nan_count=0, max_output_drift=1e-3,
                      latency=LatencyTest(test="mannwhitneyu", alpha=0.05,
                                          min_slowdown_ratio=1.05),
                      max_memory_growth_bytes=1 << 30)


def _replay_with_bursts(seed: int) -> tuple[serving.TrafficResult, _Clock]:
    rng = np.random.default_rng(seed)
    requests = _requests(80, rng)
    clock = _Clock()
    production = serving.Endpoint("production", _SameKernel("production", clock))
    candidate = serving.Endpoint("candidate", _SameKernel("candidate", clock))
    bursts = set(rng.choice(80, size=20, replace=False).tolist())

    def progress(done: int, total: int) -> None:
        clock.busy = done in bursts  # the load for the *next* request

    return serving.replay_canary_step(requests, 0.25, production, candidate,
                                      salt=f"seed{seed}", progress=progress), clock


@pytest.mark.parametrize("seed", range(5))
def test_the_same_kernel_is_never_judged_slower_under_load_that_comes_and_goes(seed):
    result, _ = _replay_with_bursts(seed)
    candidate_s, production_s = result.matched_latencies()
    assert len(candidate_s) == len(production_s) == result.served_count("candidate") > 2
    # request by request, both sides took the same time: same text, same moment
    assert candidate_s == production_s
    judged = analyse_canary_step(_plan().steps[0], candidate_s, production_s, result.drifts(),
                                 0, 0, 1, 1, _plan())
    assert judged.median_latency_ratio == pytest.approx(1.0)
    assert not judged.latency_slower and judged.passed, judged.breaches


def test_unmatched_latencies_would_confound_the_request_mix():
    """What the matching protects against: everything production served has another
    length mix and other bursts than the candidate's quarter, so the medians differ
    although the kernels are the same."""
    ratios = []
    for seed in range(5):
        result, _ = _replay_with_bursts(seed)
        ratios.append(np.median(result.latencies("candidate"))
                      / np.median(result.latencies("production")))
    assert max(abs(r - 1.0) for r in ratios) > 0.05


def test_which_side_runs_first_alternates_on_requests_both_serve():
    clock = _Clock()
    mirrored = serving.replay_shadow([Request(request_id=f"s{i}", text=f"t{i}", source="doc")
                                      for i in range(6)],
                                     serving.Endpoint("production", _SameKernel("production", clock)),
                                     serving.Endpoint("candidate", _SameKernel("candidate", clock)))
    assert mirrored.served_count("production") == 6
    assert [clock.calls[2 * i][0] for i in range(6)] == ["production", "candidate"] * 3
    for i in range(6):  # both sides ran each text, back to back
        assert clock.calls[2 * i][1] == clock.calls[2 * i + 1][1] == f"t{i}"


@pytest.mark.parametrize(("fraction", "requests", "expected"),
                         [(0.05, 100, 5), (0.25, 24, 6), (0.5, 7, 3), (0.0, 50, 0), (1.0, 9, 9)])
def test_a_step_gives_the_candidate_exactly_its_share(fraction, requests, expected):
    """A 5 % step of 100 requests once served 1 request by the candidate (hash luck):
    the latency test then had one sample where the plan was checked for five."""
    ids = [f"req-{i}" for i in range(requests)]
    counts = {len(serving.candidate_share(ids, fraction, salt=f"run{s}:step")) for s in range(20)}
    assert counts == {expected}


def test_the_split_is_replayable_and_differs_between_steps():
    ids = [f"req-{i}" for i in range(100)]
    first = serving.candidate_share(ids, 0.25, salt="run1:canary-25pct")
    assert serving.candidate_share(list(reversed(ids)), 0.25, salt="run1:canary-25pct") == first
    assert serving.candidate_share(ids, 0.25, salt="run1:canary-50pct") != first
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        serving.candidate_share(ids, 1.5)


class _WarmingKernel:
    """Identical work whose time depends on the slot within a request: the first call
    of a request is cold (+50 %) and the host drifts (+1 % per call overall)."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def embed(self, texts):
        cold = not self.log or self.log[-1][1] != texts[0]
        self.log.append((self.name, texts[0]))
        return np.ones((1, 8), dtype=np.float32), 1e-3 * (1.5 if cold else 1.0) * (
            1 + 0.01 * len(self.log))


def test_abba_times_each_compared_request_twice_a_side_in_balanced_order():
    from gates.latency_judge import abba_log_ratios

    log: list = []
    production = serving.Endpoint("production", _WarmingKernel("production", log))
    candidate = serving.Endpoint("candidate", _WarmingKernel("candidate", log))
    requests = [Request(request_id=f"r{i}", text=f"text {i}", source="doc")
                for i in range(40)]
    result = serving.replay_canary_step(requests, 0.5, production, candidate, abba=True)
    compared = [r for r in result.records if r.served_by == "candidate"]
    assert len(compared) == 20
    assert [r.order for r in compared] == ["CPPC", "PCCP"] * 10
    assert all(r.order == "P" for r in result.records if r.served_by == "production")
    cand, prod = result.abba_timings()
    assert cand.shape == prod.shape == (20, 2)
    ratios = abba_log_ratios(cand, prod)
    # the cold first slot alternates sides, so it cancels over the pairs: the median
    # log ratio of identical work is ~0, while each single order is far from it
    assert abs(np.median(ratios)) < 0.01
    assert abs(ratios[0]) > 0.1 and np.sign(ratios[0]) != np.sign(ratios[1])
    # without ABBA one timing a side, as before
    single = serving.replay_canary_step(requests, 0.5, production, candidate)
    assert single.abba_timings()[0].shape == (0, 2)
    assert all(len(r.candidate_timings_s) == 1 for r in single.records
               if r.served_by == "candidate")


class _Tokens:
    """A stand-in for MiniLM's tokenizer: a word is a token, plus [CLS] and [SEP]."""

    def tokenize(self, texts):
        ids = [[0] * (len(t.split()) + 2) for t in texts]
        return ids, np.array([len(i) for i in ids])

    def one_text_per_bucket(self, texts):
        from evaluation.model import DEFAULT_MAX_LENGTH, bucket_length

        _, lengths = self.tokenize(texts)
        return list({bucket_length(int(n), DEFAULT_MAX_LENGTH): t
                     for n, t in zip(lengths, texts, strict=True)}.values())


def test_warm_up_serves_each_bucket_once_per_runner_across_stages():
    """Shadow, then three canary steps: a runner that kept its compiled programs is not
    served its buckets again; a new runner (or a new bucket) is."""
    clock = _Clock()
    runner = _SameKernel("candidate", clock)
    short = [Request(request_id=f"s{i}", text="w " * n, source="d") for i, n in enumerate((3, 20, 50))]
    longer = [*short, Request(request_id="l", text="w " * 200, source="d")]
    model = _Tokens()
    first = serving.warm_up(short, [serving.Endpoint("c", runner)], model)
    again = serving.warm_up(short, [serving.Endpoint("c, next stage", runner)], model)
    grown = serving.warm_up(longer, [serving.Endpoint("c", runner)], model)
    fresh = serving.warm_up(short, [serving.Endpoint("p", _SameKernel("p", clock))], model)
    assert (first, again, grown, fresh) == (3, 0, 1, 3)
    assert len(clock.calls) == 7
