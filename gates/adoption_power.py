"""The adoption test's power and A/A behaviour by simulation (vectorised NumPy).

``simulate_decisions`` runs :func:`gates.adoption.judge`'s decision rule on many
simulated runs at once from counts alone (the first pair count at which the signs reach
the boundary; no sorting), so calibrating on thousands of runs takes seconds.
``adoption_power`` is the adoption rate at a planted effect; ``pairs_for_adoption_power``
sizes ``max_pairs`` for the plan's power; ``tuned_rho`` picks the mixture precision
whose boundary is tightest at a planned pair count. See ``gates.adoption`` for the test.
"""

from __future__ import annotations

import math

import numpy as np

from gates.adoption import AdoptionPlan, sign_boundary


def tuned_rho(alpha: float, n_pairs: int) -> float:
    """The mixture precision whose boundary is tightest at ``n_pairs`` (a grid search over
    ``rho``): preregister it for the pair count where decisions are expected.

    Raises:
        ValueError: ``n_pairs < 1`` or ``alpha`` outside (0, 1).
    """
    if n_pairs < 1 or not 0.0 < alpha < 1.0:
        raise ValueError(f"need n_pairs >= 1 and alpha in (0, 1), got {n_pairs}, {alpha}")
    grid = np.geomspace(0.01, 10.0, 61) * n_pairs
    k = np.array([sign_boundary(n_pairs, alpha, float(r)) for r in grid])
    return float(grid[int(np.argmin(k))])


def _first_decisions(plan: AdoptionPlan, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each run (row of ``d``), the first pair count (1-based) at which the running
    confidence sequence adopts or finds it not worth it (``inf`` where never), computed
    from counts (fast: no sorting)."""
    n = d.shape[1]
    k = sign_boundary(np.arange(1, n + 1), plan.alpha, plan.mixture_rho)
    above = np.cumsum(d > plan.theta0, axis=1)  # signs against adoption's null
    below = np.cumsum(d < plan.delta, axis=1)  # signs against 'worth it'
    adopt_hit = above >= k
    nwi_hit = below >= k
    steps = np.arange(1, n + 1, dtype=float)
    adopt_at = np.where(adopt_hit.any(axis=1), steps[adopt_hit.argmax(axis=1)], np.inf)
    nwi_at = np.where(nwi_hit.any(axis=1), steps[nwi_hit.argmax(axis=1)], np.inf)
    return adopt_at, nwi_at


def simulate_decisions(plan: AdoptionPlan, d: np.ndarray) -> np.ndarray:
    """The verdict of each simulated run: ``d`` is ``[runs, pairs]`` log speed-ups
    (``-log ratio``); runs end at ``min(pairs, plan.max_pairs)``.

    Returns:
        array of str: ``adopt``, ``not_worth_it`` or ``inconclusive`` per run
        (``not_worth_it`` wins a tie, as in :func:`judge`).
    """
    d = np.asarray(d, dtype=np.float64)[:, : plan.max_pairs]
    adopt_at, nwi_at = _first_decisions(plan, d)
    out = np.full(d.shape[0], "inconclusive", dtype=object)
    out[np.isfinite(adopt_at) & (adopt_at < nwi_at)] = "adopt"
    out[np.isfinite(nwi_at) & (nwi_at <= adopt_at)] = "not_worth_it"
    return out


def adoption_power(plan: AdoptionPlan, *, ratio: float | None = None,
                   noise_sd: float | None = None, runs: int = 2000, seed: int = 0) -> float:
    """Simulated adoption rate at a true median ``ratio`` (default the minimum worthwhile)
    under normal log-ratio noise (default the plan's ``noise_sd``), ``runs`` runs of up
    to ``plan.max_pairs`` pairs (seeded; vectorised).

    Raises:
        ValueError: ``runs < 1`` or a non-positive ratio or noise.
    """
    ratio = plan.minimum_worthwhile_ratio if ratio is None else ratio
    noise_sd = plan.noise_sd if noise_sd is None else noise_sd
    if runs < 1 or ratio <= 0 or noise_sd <= 0:
        raise ValueError(f"need runs >= 1, ratio > 0, noise_sd > 0; got {runs}, {ratio}, "
                         f"{noise_sd}")
    rng = np.random.default_rng(seed)
    d = -math.log(ratio) + noise_sd * rng.standard_normal((runs, plan.max_pairs))
    return float(np.mean(simulate_decisions(plan, d) == "adopt"))


def pairs_for_adoption_power(plan: AdoptionPlan, *, runs: int = 2000, seed: int = 0,
                             cap: int = 20_000) -> int:
    """The fewest ``max_pairs`` at which :func:`adoption_power` (at the minimum worthwhile
    effect and the plan's noise) reaches ``plan.power``: simulations of 256, 512, ...
    pairs (at most ``cap``), each read at every truncation (adoption by ``n`` only grows
    with ``n``).

    Raises:
        ValueError: the power is not reached within ``cap`` pairs (say so, never guess).
    """
    need = math.ceil(plan.power * runs)
    horizon = 256
    while True:
        horizon = min(horizon, cap)
        rng = np.random.default_rng(seed)
        d = plan.delta + plan.noise_sd * rng.standard_normal((runs, horizon))
        adopt_at, nwi_at = _first_decisions(plan.model_copy(update={"max_pairs": horizon}), d)
        adopted_at = np.sort(np.where(adopt_at < nwi_at, adopt_at, np.inf))
        if np.isfinite(adopted_at[need - 1]):
            return int(adopted_at[need - 1])
        if horizon >= cap:
            raise ValueError(f"power {plan.power} is not reached within {cap} pairs at ratio "
                             f"{plan.minimum_worthwhile_ratio} and noise_sd {plan.noise_sd}")
        horizon *= 2


