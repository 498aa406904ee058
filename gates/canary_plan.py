"""The preregistered canary plan: steps, per-step limits and the latency test.

Part of the thresholds schema (``gates.thresholds``); every field declares its looser
direction where it is defined (``gates.directions.limit``).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import field_validator, model_validator

from gates.directions import Looser as L
from gates.directions import limit
from gates.latency_judge import pairs_for_power, powered_noise_sd, signed_rank_power
from gates.schema_base import _KEY, _N, Finite, Name, _Strict


def smallest_p_value(n1: int, n2: int) -> float:
    """The smallest one-sided p-value an exact Mann-Whitney U test can give with samples
    of ``n1`` and ``n2``: one ordering out of ``C(n1 + n2, n1)`` (1.0 when a side is empty).
    With 3 vs 3 it is 1/20 = 0.05, so a test at alpha = 0.05 can never reject."""
    if n1 < 1 or n2 < 1:
        return 1.0
    orderings = math.comb(n1 + n2, n1)
    # a float holds up to ~1e308; beyond it the p-value is 0 for every purpose here
    return 1.0 / orderings if orderings < 10**300 else 0.0


class CanaryStep(_Strict):
    """One canary step: a deterministic fraction of traffic routed to the candidate."""

    name: Name = limit(_N, why=_KEY)
    traffic_fraction: Finite = limit(L.ANY_CHANGE, gt=0, le=1)
    requests: int = limit(L.LOWER, gt=0, le=1_000_000,
                          description="Requests served during the step (both arms).")


class LatencyTest(_Strict):
    """Preregistered one-sided test "is the candidate slower than production?".

    ``signed_rank_abba`` (``gates.latency_judge``): each compared request is timed ABBA;
    step ``k`` tests the per-request log ratios of steps ``1..k`` with the one-sided
    Wilcoxon signed-rank test at ``alpha_k``, the parts of ``alpha`` spent in proportion
    to the compared requests each step adds (``spending: by_requests``), so an identical
    kernel is rolled back at any step with probability at most ``alpha``. The plan
    states the smallest slowdown it must catch (``min_slowdown_ratio``), the power to
    catch it and the per-request log-ratio noise (``noise_sd``) it is valid for; a canary
    that ends without a rejection but with too few pairs or more noise is
    *inconclusive*, and ``inconclusive`` says what that does.

    ``mannwhitneyu`` is the legacy unpaired test, one per step at the full alpha, with
    ``min_slowdown_ratio`` as a practical-significance floor on the median ratio: kept
    only so that registrations stored before the paired test still load and their
    canaries can be re-derived by the audit. No shipped profile uses it.
    """

    test: Literal["signed_rank_abba", "mannwhitneyu"] = limit(L.ANY_CHANGE)
    alternative: Literal["greater"] = limit(L.ANY_CHANGE, default="greater")
    alpha: Finite = limit(L.LOWER, ge=1e-6, lt=0.5, description="Whole-canary false-rollback "
                          "rate (signed_rank_abba); per step (mannwhitneyu).")
    min_slowdown_ratio: Finite = limit(L.HIGHER, default=1.0, ge=1.0, le=10.0)
    tolerated_slowdown_ratio: Finite = limit(
        L.HIGHER, default=1.0, ge=1.0, le=10.0, description="H0 of the paired test: the "
        "candidate's median request is at most this much slower (1.0: not slower at all).")
    power: Finite | None = limit(
        L.LOWER, default=None, gt=0, lt=1,
        description="Chance of catching a true slowdown of min_slowdown_ratio.")
    noise_sd: Finite | None = limit(
        L.HIGHER, default=None, gt=0, le=5,
        description="Per-request log-ratio sd (robust: 1.4826 MAD) the plan is valid for; "
        "a canary measuring more is inconclusive.")
    spending: Literal["by_requests"] = limit(L.ANY_CHANGE, default="by_requests")
    inconclusive: Literal["reject", "pause"] | None = limit(
        L.ANY_CHANGE, default=None, description="What an inconclusive canary does: reject "
        "(roll back, recorded) or pause for a person (reject where no person can be asked).")
    max_calibration_age_days: Finite | None = limit(
        L.HIGHER, default=None, gt=0, le=3650,
        description="Require a fresh A/A calibration of the serving device this recent.")
    noise_within_buckets: bool = limit(
        L.FALSE_TO_TRUE, default=False, description="Measure the noise the power is judged "
        "at about each length bucket's own median (gates.latency_judge.within_bucket_sd), "
        "not about the pooled median: where the buckets' ratios differ (a long-document "
        "workload: 0.1 at 16k, 0.6 at 1k tokens), that spread is the effect's shape, not "
        "noise, and counted as noise it takes extra looks a slowdown of the stated size "
        "would not need. The test itself stays the pooled signed-rank test. Needs a "
        "canary workload (which records the buckets).")

    @model_validator(mode="after")
    def _complete(self) -> LatencyTest:
        paired = ("power", "noise_sd", "inconclusive")
        if self.test == "signed_rank_abba":
            missing = [n for n in paired if getattr(self, n) is None]
            if missing:
                raise ValueError(f"latency test signed_rank_abba needs {missing}")
            if self.min_slowdown_ratio <= self.tolerated_slowdown_ratio:
                raise ValueError("latency test signed_rank_abba needs min_slowdown_ratio > "
                                 "tolerated_slowdown_ratio: the slowdown its power is stated for")
        elif self.tolerated_slowdown_ratio != 1.0 or any(
                getattr(self, n) is not None for n in (*paired, "max_calibration_age_days")):
            raise ValueError("the legacy mannwhitneyu test takes no power, noise_sd, inconclusive, "
                             "tolerated_slowdown_ratio or max_calibration_age_days")
        if self.noise_within_buckets and self.test != "signed_rank_abba":
            raise ValueError("noise_within_buckets needs the paired signed_rank_abba test")
        return self


MORE_SUFFIX = ".more"
"""An extra look's step name: the last step's name, this, and its number (``canary-50pct.more1``)."""


class CanaryExtension(_Strict):
    """Extra looks after the last step, taken while the measured noise leaves the paired
    test short of its power (a sequential plan with a stated maximum).

    Each extra look serves ``requests`` more requests at the last step's traffic fraction
    and adds them to the test. The alpha of every look the plan *may* take, the extra ones
    included, is fixed before any data is seen (``CanaryPlan.step_alphas`` spends
    ``alpha`` over them by requests), so an identical kernel is rolled back with
    probability at most ``alpha`` however many are taken. With an extension the canary
    passes when its last look's power at the *measured* noise reaches the stated power
    (``gates.latency_judge.conclude_powered``) instead of when the measured noise is within
    ``noise_sd``: ``noise_sd`` then sizes the steps, and the extension carries the plan up
    to the noise its largest look can power (``CanaryPlan.noise_ceiling``).
    """

    max_steps: int = limit(L.LOWER, ge=0, le=50, description=(
        "The most extra looks after the last step (0: none, but the canary is judged by its "
        "power at the measured noise)."))
    requests: int = limit(L.LOWER, gt=0, le=1_000_000,
                          description="Requests each extra look serves (both arms).")


class CanaryPlan(_Strict):
    """Steps and per-step failure limits watched during the canary."""

    steps: list[CanaryStep] = limit(L.FEWER, key="name", min_length=1)
    max_error_count: int = limit(L.HIGHER, ge=0)
    max_nan_count: int = limit(L.HIGHER, ge=0)
    max_output_drift: Finite = limit(
        L.HIGHER, gt=0, lt=1,
        description="Max rel. L2 between candidate and production embeddings, per request.")
    latency: LatencyTest = limit(L.NESTED)
    max_memory_growth_bytes: int = limit(L.HIGHER, ge=0, le=2**40)
    max_p99_ratio: Finite | None = limit(
        L.HIGHER, default=None, gt=1, le=100,
        description="Max p99(candidate)/p99(production) request latency, per step and over "
        "the whole canary (judged where at least 500 pairs were compared).")
    extend: CanaryExtension | None = limit(
        L.NESTED, default=None, description="Extra looks while the measured noise leaves the "
        "latency test short of its power (a sequential plan); unset: no extra look, and a "
        "canary measuring more noise than noise_sd is inconclusive.")
    exclude_production_failures: bool = limit(
        L.FALSE_TO_TRUE, default=False, description="A request production fails is left out "
        "of the comparison and reported (per length bucket), never charged to the "
        "candidate: for a workload with requests the baseline cannot serve (xla's score "
        "matrix at 32k tokens). Unset: any production failure breaches the step, since "
        "nothing was compared on it.")
    workload: Name | None = limit(
        L.ANY_CHANGE, default=None, description="What the canary steps replay: unset, the "
        "recorded MiniLM requests; the name of a shipped long-document workload "
        "(workloads/<name>.yaml): its documents, each timed ABBA on both sides and carrying "
        "its length bucket for decision.buckets (evaluation.longdoc.canary_source). The "
        "shadow stage replays MiniLM requests either way.")

    @property
    def paired(self) -> bool:
        """True for the paired, alpha-spending latency test (``signed_rank_abba``)."""
        return self.latency.test == "signed_rank_abba"

    def looks(self) -> list[CanaryStep]:
        """Every step the canary may take: the registered steps, then the extension's extra
        looks (``<last step>.more1``, ...) at the last step's traffic fraction."""
        if self.extend is None or self.extend.max_steps == 0:
            return list(self.steps)
        last = self.steps[-1]
        return [*self.steps, *(CanaryStep(name=f"{last.name}{MORE_SUFFIX}{i}",
                                          traffic_fraction=last.traffic_fraction,
                                          requests=self.extend.requests)
                               for i in range(1, self.extend.max_steps + 1))]

    def pairs_per_step(self) -> list[int]:
        """Compared requests each registered step adds: ``floor(fraction * requests)``."""
        return [math.floor(s.traffic_fraction * s.requests) for s in self.steps]

    def pairs_per_look(self) -> list[int]:
        """Compared requests each of :meth:`looks` adds."""
        return [math.floor(s.traffic_fraction * s.requests) for s in self.looks()]

    def step_alphas(self) -> list[float]:
        """The alpha each of :meth:`looks` spends (by the requests it adds; they sum to
        alpha, the extra looks' share reserved whether or not they are taken)."""
        weights = [max(n, 1) for n in self.pairs_per_look()]
        return [self.latency.alpha * w / sum(weights) for w in weights]

    def required_pairs(self) -> int:
        """The pairs the last registered step's look needs to reach the stated power at the
        plan's ``noise_sd`` (paired test)."""
        t = self.latency
        return pairs_for_power(self.step_alphas()[len(self.steps) - 1], self.detectable_ratio,
                               t.noise_sd, t.power)

    def noise_ceiling(self) -> float:
        """The largest per-request log-ratio noise (robust sd) at which the plan's last
        possible look still reaches the stated power: ``noise_sd``'s reach with the extra
        looks (paired test; ``noise_sd`` itself without an extension, whose rule is the
        bound)."""
        t = self.latency
        if self.extend is None:
            return float(t.noise_sd)
        return powered_noise_sd(sum(self.pairs_per_look()), self.step_alphas()[-1],
                                self.detectable_ratio, t.power)

    def is_look_sequence(self, names: list[str]) -> bool:
        """Whether ``names`` (steps in the order taken) are the registered steps, in order,
        followed by none or more of the extension's extra looks in order."""
        planned = [s.name for s in self.looks()]
        return len(self.steps) <= len(names) <= len(planned) and names == planned[:len(names)]

    @property
    def detectable_ratio(self) -> float:
        """``min_slowdown_ratio / tolerated_slowdown_ratio``: the shift the test must see."""
        return self.latency.min_slowdown_ratio / self.latency.tolerated_slowdown_ratio

    def power_problem(self) -> str | None:
        """Why the plan's sizes cannot reach its stated power, or None when they can (or
        the test is the legacy one). The loader refuses such a plan where latency can
        block (``Thresholds.not_assessed_blocks_promotion``); elsewhere the canary
        reports its latency as not assessed with this reason."""
        if not self.paired:
            return None
        t, total = self.latency, sum(self.pairs_per_step())
        last_alpha = self.step_alphas()[len(self.steps) - 1]
        reached = signed_rank_power(total, last_alpha, self.detectable_ratio, t.noise_sd)
        if reached >= t.power:
            return None
        return (f"the canary's {total} compared requests cannot reach its power: {reached:.3f} < "
                f"{t.power:g} at slowdown {t.min_slowdown_ratio:g} and noise sd "
                f"{t.noise_sd:g} (alpha of the last step's look {last_alpha:.3g}); it "
                f"needs {self.required_pairs()}: serve more requests")

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[CanaryStep]) -> list[CanaryStep]:
        fractions = [s.traffic_fraction for s in steps]
        if fractions != sorted(set(fractions)):
            raise ValueError(f"canary traffic fractions must strictly increase, got {fractions}")
        names = [s.name for s in steps]
        if len(set(names)) != len(names):
            raise ValueError(f"canary step names must be unique, got {names}")
        return steps

    @model_validator(mode="after")
    def _limits_and_power(self) -> CanaryPlan:
        if self.latency.noise_within_buckets and self.workload is None:
            raise ValueError("latency.noise_within_buckets needs canary.workload: MiniLM's "
                             "recorded requests carry no length bucket")
        fewest = min(s.requests for s in self.steps)
        for name in ("max_error_count", "max_nan_count"):
            if getattr(self, name) > fewest:
                raise ValueError(f"{name} ({getattr(self, name)}) exceeds the requests of the "
                                 f"smallest step ({fewest}): the limit could never be reached")
        for step in self.steps if not self.paired else ():
            n_candidate = math.floor(step.traffic_fraction * step.requests)
            # production's latencies are taken on the candidate's requests (mirrored)
            smallest = smallest_p_value(n_candidate, n_candidate)
            if smallest >= self.latency.alpha:
                raise ValueError(
                    f"canary step {step.name!r}: with about {n_candidate} candidate and "
                    f"{n_candidate} production latencies (the same requests) the smallest "
                    "one-sided Mann-Whitney "
                    f"p-value is {smallest:.3g}, never below alpha={self.latency.alpha:g}: the "
                    "latency test could never fire; serve more requests in the step")
        empty = [s.name for s, n in zip(self.steps, self.pairs_per_step(), strict=True) if n < 1]
        if self.paired and empty:
            raise ValueError(f"canary steps {empty} compare no request (fraction x requests < 1)")
        if self.extend is not None and not self.paired:
            raise ValueError("a canary extension needs the paired latency test "
                             "(signed_rank_abba): its extra looks are that test's")
        if self.extend is not None and self.extend.max_steps:
            last = self.steps[-1]
            if len(last.name) + len(MORE_SUFFIX) + len(str(self.extend.max_steps)) > 64:
                raise ValueError(f"the last canary step's name {last.name!r} is too long to name "
                                 "the extension's looks (<name>.moreN, at most 64 characters)")
            if math.floor(last.traffic_fraction * self.extend.requests) < 1:
                raise ValueError("the canary extension's looks compare no request (the last "
                                 "step's fraction x extend.requests < 1)")
        total = sum(self.pairs_per_step())
        if self.paired and 2.0 ** -total >= self.step_alphas()[len(self.steps) - 1]:
            # a test that can never fire is refused on every profile; one that can but
            # lacks the stated power is refused where latency can block (power_problem)
            raise ValueError(
                f"the canary's {total} compared requests give a smallest one-sided signed-rank "
                f"p-value of {2.0 ** -total:.3g}, never below the last step's alpha="
                f"{self.step_alphas()[len(self.steps) - 1]:.3g}: the latency test could never "
                "fire; serve more requests")
        return self


