"""The paired, alpha-spending latency judge, tested both ways by simulation.

Null (A/A): the same kernel on both sides, so per-request log ratios are symmetric
about 0; at least 1000 simulated canaries of a profile's sizes must be rolled back at
no more than alpha plus its 95 % binomial margin. Planted fault: a true slowdown at the
plan's ``min_slowdown_ratio`` must be caught at least at the plan's stated power.
The host model (``_host``) has the faults a shared machine has: an order effect
between the slots of a request, drift, spikes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gates import latency_judge as lj

STEPS = (("canary-5pct", 0.05, 100), ("canary-25pct", 0.25, 100), ("canary-50pct", 0.5, 100))
"""The production profile's canary steps today: (name, fraction, requests)."""
ALPHA = 0.05
N_SIMULATED = 1000


def _pairs_per_step(steps=STEPS) -> list[int]:
    return [math.floor(f * n) for _, f, n in steps]


def _margin(rate: float, n: int) -> float:
    return 1.96 * math.sqrt(rate * (1 - rate) / n)


def _simulate(draw, *, steps=STEPS, alpha=ALPHA, noise_sd=0.1, required=None, n=N_SIMULATED,
              seed=0):
    """Run ``n`` simulated canaries; ``draw(rng, k)`` gives k per-request log ratios."""
    rng = np.random.default_rng(seed)
    sizes = _pairs_per_step(steps)
    alphas = lj.spend_alpha(alpha, sizes)
    required = sum(sizes) if required is None else required
    verdicts = []
    for _ in range(n):
        seen: list[float] = []
        looks = []
        for (name, _, _), size, a in zip(steps, sizes, alphas, strict=True):
            seen.extend(draw(rng, size))
            looks.append(lj.look(name, seen, a))
            if looks[-1].slower:
                break
        verdicts.append(lj.conclude(looks, required_pairs=required, noise_sd=noise_sd)[0])
    return verdicts


@pytest.mark.parametrize("noise", ("normal", "student-t3", "laplace"))
def test_a_a_false_rollbacks_stay_within_alpha(noise):
    draws = {
        "normal": lambda rng, k: rng.normal(0.0, 0.1, k),
        "student-t3": lambda rng, k: 0.05 * rng.standard_t(3, k),
        "laplace": lambda rng, k: rng.laplace(0.0, 0.07, k),
    }
    verdicts = _simulate(draws[noise], noise_sd=1.0)
    rate = verdicts.count("fail") / len(verdicts)
    assert rate <= ALPHA + _margin(ALPHA, len(verdicts)), f"A/A false rollbacks {rate:.3f}"


def test_a_slowdown_at_the_minimum_is_caught_at_the_stated_power():
    min_slowdown, noise_sd, power = 1.10, 0.08, 0.9
    sizes = _pairs_per_step()
    alpha_last = lj.spend_alpha(ALPHA, sizes)[-1]
    # the plan is sized for its power (the loader's rule), then checked by simulation
    assert lj.signed_rank_power(sum(sizes), alpha_last, min_slowdown, noise_sd) >= power
    shift = math.log(min_slowdown)
    verdicts = _simulate(lambda rng, k: rng.normal(shift, noise_sd, k), noise_sd=noise_sd)
    caught = verdicts.count("fail") / len(verdicts)
    assert caught >= power, f"power {caught:.3f} < stated {power}"


def test_power_formula_agrees_with_simulation():
    n, alpha, rho, sd = 40, 0.02, 1.05, 0.1
    predicted = lj.signed_rank_power(n, alpha, rho, sd)
    rng = np.random.default_rng(3)
    hits = sum(lj.look("x", rng.normal(math.log(rho), sd, n), alpha).slower
               for _ in range(N_SIMULATED))
    assert abs(hits / N_SIMULATED - predicted) < 0.06, (hits / N_SIMULATED, predicted)


def test_pairs_for_power_is_the_smallest_that_reaches_it():
    n = lj.pairs_for_power(0.0167, 1.1, 0.1, 0.9)
    assert lj.signed_rank_power(n, 0.0167, 1.1, 0.1) >= 0.9
    assert lj.signed_rank_power(n - 1, 0.0167, 1.1, 0.1) < 0.9


def _host(rng, n_requests: int, slots: int):
    """Timings (seconds) of identical work on a shared host, ``[n_requests, slots]`` in
    the order they ran: a request-length mix (log-normal); an order effect, each slot
    after the first 50 % slower (device work of the slot before it, left running when a
    timer stops before the device is done); a slow drift within the request (+2 % a
    slot); rare 2-4x spikes (5 % of timings, the neighbours' load)."""
    base = rng.lognormal(-3.0, 0.3, (n_requests, 1))
    slot = 1.0 + 0.5 * (np.arange(slots) > 0) + 0.02 * np.arange(slots)
    spikes = np.where(rng.random((n_requests, slots)) < 0.05,
                      rng.uniform(2.0, 4.0, (n_requests, slots)), 1.0)
    noise = np.exp(rng.normal(0.0, 0.05, (n_requests, slots)))
    return base * slot * spikes * noise


def test_abba_on_a_shared_host_keeps_a_a_within_alpha():
    """The new measurement on the host model: ABBA on even requests, BAAB on odd ones."""
    def draw(rng, k):
        t = _host(rng, k, 4)
        abba = np.arange(k) % 2 == 0
        cand = np.where(abba[:, None], t[:, [0, 3]], t[:, [1, 2]])
        prod = np.where(abba[:, None], t[:, [1, 2]], t[:, [0, 3]])
        return lj.abba_log_ratios(cand, prod)

    verdicts = _simulate(draw, noise_sd=1.0)
    rate = verdicts.count("fail") / len(verdicts)
    assert rate <= ALPHA + _margin(ALPHA, len(verdicts)), rate


def test_inconclusive_when_too_few_pairs_or_too_noisy():
    rng = np.random.default_rng(5)
    quiet = [lj.look("s", rng.normal(0, 0.01, 30), 0.05)]
    assert lj.conclude(quiet, required_pairs=30, noise_sd=0.05)[0] == "pass"
    verdict, why = lj.conclude(quiet, required_pairs=31, noise_sd=0.05)
    assert verdict == "inconclusive" and "too few" in why
    noisy = [lj.look("s", rng.normal(0, 0.5, 30), 0.05)]
    verdict, why = lj.conclude(noisy, required_pairs=30, noise_sd=0.05)
    assert verdict == "inconclusive" and "too noisy" in why


def test_abba_log_ratios_cancel_a_linear_drift():
    """A host slowing down linearly within each request: A B B A timings of identical
    work (1 ms each, +10 us per slot) give a log ratio of exactly 0."""
    slots = 1e-3 + 1e-5 * np.arange(4)
    candidate = np.array([[slots[0], slots[3]]])
    production = np.array([[slots[1], slots[2]]])
    assert lj.abba_log_ratios(candidate, production)[0] == pytest.approx(0.0, abs=1e-12)
    # the same drift, alternating order (A B A B), is not cancelled
    assert lj.abba_log_ratios(np.array([[slots[0], slots[2]]]),
                              np.array([[slots[1], slots[3]]]))[0] < 0


def test_bad_inputs_are_refused_with_the_constraint():
    with pytest.raises(ValueError, match="alpha"):
        lj.spend_alpha(0.0, [1, 2])
    with pytest.raises(ValueError, match="weights"):
        lj.spend_alpha(0.05, [1, 0])
    with pytest.raises(ValueError, match=r"\[n, 2\]"):
        lj.abba_log_ratios(np.ones((3, 2)), np.ones((3, 3)))
    with pytest.raises(ValueError, match="positive"):
        lj.abba_log_ratios(np.ones((1, 2)), np.zeros((1, 2)))
    with pytest.raises(ValueError, match="slowdown_ratio"):
        lj.signed_rank_power(10, 0.05, 1.0, 0.1)
    assert sum(lj.spend_alpha(0.05, [5, 25, 50])) == pytest.approx(0.05)
