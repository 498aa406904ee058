"""The adoption decision's views on its rollout run: the metrics are the decision's own
figures (a bucket's interval side that is unbounded or unset is left out, not logged as a
number), the plot is a PNG drawn from the decision (one row per required bucket, a bucket
not assessed drawn as text), and the decision JSON is logged before either."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gates.adoption_decision import conclude_adoption
from gates.adoption_plot import plot_adoption
from lineage.records.adoption_record import PLOT_ARTIFACT, adoption_metrics, log_adoption
from lineage.store import tags
from lineage.store.tracking import local_tracking
from tests.test_gates_adoption_buckets import PLAN, _traffic

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def mixed():
    """A claim over 128 and 256 tokens where 128 is 20 % faster and 256 has too few pairs."""
    ratios, buckets = _traffic({128: 0.8, 256: 0.8}, mix={128: 0.98, 256: 0.02}, seed=1)
    plan = PLAN.model_copy(update={"min_pairs_per_bucket": 30})
    return conclude_adoption(plan, "pass", ratios, buckets=buckets)


def test_metrics_are_each_buckets_own_figures_and_unassessed_ones_are_left_out(mixed):
    metrics = adoption_metrics(mixed)
    fast, short = mixed.buckets
    assert fast.status == "adopt" and short.status == "not_assessed"
    assert metrics["adoption.adopted"] == 0.0  # one required bucket is not assessed
    assert metrics["adoption.bucket_128.median_ratio"] == fast.median_ratio
    assert metrics["adoption.bucket_128.ratio_upper"] == fast.ratio_upper < 1.0
    assert metrics["adoption.bucket_128.n_pairs"] == fast.n_pairs
    assert metrics["adoption.bucket_256.n_pairs"] == short.n_pairs < 30
    assert metrics["adoption.bucket_256.assessed"] == 0.0 < metrics["adoption.bucket_128.assessed"]
    assert "adoption.bucket_256.median_ratio" not in metrics  # too few pairs: no finding
    assert all(math.isfinite(v) for v in metrics.values())


def test_an_unbounded_interval_side_is_not_logged_as_a_number(mixed, tmp_path):
    fast = mixed.buckets[0].model_copy(update={"ratio_upper": math.inf})
    unbounded = mixed.model_copy(update={"buckets": [fast, mixed.buckets[1]]})
    metrics = adoption_metrics(unbounded)
    assert "adoption.bucket_128.ratio_upper" not in metrics
    assert metrics["adoption.bucket_128.ratio_lower"] == fast.ratio_lower
    # and it is drawn (to the axis edge) rather than refused
    png = plot_adoption(unbounded, 0.9, tmp_path / "unbounded.png")
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_a_pooled_decision_gives_pooled_metrics_and_adopted_is_one(tmp_path):
    rng = np.random.default_rng(3)
    plan = PLAN.model_copy(update={"buckets": []})
    steps = [list(np.log(0.8) + 0.08 * rng.standard_normal(n)) for n in (20, 60, 120)]
    verdict = conclude_adoption(plan, "pass", steps)
    assert verdict.outcome == "adopted", verdict.reason
    metrics = adoption_metrics(verdict)
    assert metrics["adoption.adopted"] == 1.0
    assert metrics["adoption.median_ratio"] == verdict.median_ratio
    assert not any(k.startswith("adoption.bucket_") for k in metrics)
    png = plot_adoption(verdict, plan.minimum_worthwhile_ratio, tmp_path / "p" / "e.png")
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_the_rollout_run_gets_the_decision_its_metrics_and_its_plot(mixed, tmp_path):
    tracking = local_tracking(tmp_path / "store")
    client = tracking.client()
    run = client.create_run(client.create_experiment("adoption-record"))
    log_adoption(tracking, run.info.run_id, mixed, 0.9)
    logged = client.get_run(run.info.run_id).data.metrics
    assert logged == pytest.approx(adoption_metrics(mixed))
    folder = client.download_artifacts(run.info.run_id, "adoption", str(tmp_path / "down"))
    decision = json.loads((tmp_path / "down" / "adoption" / "decision.json").read_text())
    assert decision["outcome"] == mixed.outcome and len(decision["buckets"]) == 2
    png = (tmp_path / "down" / PLOT_ARTIFACT).read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5_000, folder
    run_tags = client.get_run(run.info.run_id).data.tags
    assert tags.DIGEST_PREFIX + tags.ADOPTION_ARTIFACT in run_tags


def test_the_same_decision_draws_the_same_bytes(mixed, tmp_path):
    first = plot_adoption(mixed, 0.9, tmp_path / "a.png").read_bytes()
    second = plot_adoption(mixed, 0.9, tmp_path / "b.png").read_bytes()
    assert first == second
    other = plot_adoption(mixed, 0.8, tmp_path / "c.png").read_bytes()
    assert other != first  # the worthwhile line is drawn from the argument


def test_the_effect_axis_labels_few_minor_ticks_over_a_decade_and_all_within_one():
    from gates.adoption_plot import _minor_label
    wide = _minor_label(0.065, 1.2)  # the H100 long-document decision's span: 0.07-0.09 collided
    assert [wide(x, None) for x in (0.07, 0.08, 0.09, 0.2, 0.3, 0.4, 0.5, 0.9)] == [
        "", "", "", "0.2", "0.3", "", "0.5", ""]
    narrow = _minor_label(0.85, 1.15)
    assert [narrow(x, None) for x in (0.9, 1.1)] == ["0.9", "1.1"]
