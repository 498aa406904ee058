"""The recorded request stream of a rollout, cut before any traffic is served: MiniLM
requests for the shadow and each canary look, or the registered workload's documents."""

from __future__ import annotations

from pydantic import BaseModel

from evaluation import recorded_traffic
from evaluation.documents import assign_splits, load_documents
from evaluation.longdoc import canary_source
from flows.results import Gated, Preregistered, RolloutContext
from flows.tasks import run_logger, stage_task
from gates.adoption_buckets import claim_power
from gates.canary_plan import CanaryStep
from lineage.rollout import evidence


class TrafficPlan(BaseModel):
    """The recorded stream cut into consecutive, disjoint segments: shadow first, then
    one per canary step of the registered plan."""

    shadow: recorded_traffic.RecordedTraffic
    canary: list[tuple[CanaryStep, recorded_traffic.RecordedTraffic]]
    longdoc: list[canary_source.LongdocStep] = []
    """Per canary look, the long-document workload's documents (``canary.workload``)."""
    longdoc_shadow: canary_source.LongdocStep | None = None
    """The workload's documents the shadow stage replays instead of ``shadow``."""

    def shadow_look(self) -> recorded_traffic.RecordedTraffic | canary_source.LongdocStep:
        """What the shadow stage replays: the workload's documents where the canary
        replays a workload (a kernel is mirrored on what it will serve), else the recorded
        MiniLM requests."""
        return self.longdoc_shadow if self.longdoc_shadow is not None else self.shadow

    def looks(self) -> list[tuple[CanaryStep, recorded_traffic.RecordedTraffic
                                  | canary_source.LongdocStep]]:
        """Each canary look and what it replays: its long documents where the
        registration names a workload, else its recorded MiniLM requests."""
        if not self.longdoc:
            return list(self.canary)
        return [(step, docs) for (step, _), docs in zip(self.canary, self.longdoc, strict=True)]


@stage_task(name="record-traffic")
def record_traffic(context: RolloutContext, preregistered: Preregistered,
                   gated: Gated) -> TrafficPlan:
    """Cut the request stream from held-out documents only and log it to the rollout
    run: one segment for shadow (the size the registration bound), one per step of the
    registered canary plan, and one per extra look its extension may take (served only
    if the look is taken)."""
    steps = gated.thresholds.canary.looks()
    sizes = [preregistered.shadow_requests(context.settings), *(s.requests for s in steps)]
    documents = assign_splits(load_documents(context.settings.documents_dir))["heldout"]
    traffic = recorded_traffic.record_traffic(documents, sum(sizes), seed=0)
    evidence.log_traffic(context.record,
                         traffic.write(context.record.work_dir / "traffic" / "requests-0.json"))
    shadow, *canary = recorded_traffic.split_traffic(traffic, sizes)
    longdoc, longdoc_shadow = [], None
    if (workload := gated.thresholds.canary.workload) is not None:
        decision = gated.thresholds.decision
        longdoc = canary_source.record_steps(workload, [s.requests for s in steps],
                                             decision.buckets if decision else [])
        # the shadow's documents from a stream of their own: every draw of a stream moves
        # when its size does, so the canary's documents stay what they are for any shadow
        [longdoc_shadow] = canary_source.record_steps(
            workload, [sizes[0]], [], seed_offset=canary_source.SHADOW_SEED_OFFSET)
        traffic_dir = context.record.work_dir / "traffic"
        evidence.log_traffic(context.record, canary_source.write_steps(
            longdoc, traffic_dir / "longdoc-documents.json"))
        evidence.log_traffic(context.record, canary_source.write_steps(
            [longdoc_shadow], traffic_dir / "longdoc-shadow-documents.json"))
        run_logger().info("shadow and canary replay workload %s (%d + %d documents)%s",
                          workload, sizes[0], sum(len(s.documents) for s in longdoc),
                          _bucket_power(gated, longdoc))
    else:  # said either way: which traffic a verdict rests on is never left to guess
        registered = sum(s.requests for s in gated.thresholds.canary.steps)
        run_logger().info("canary replays MiniLM's recorded requests (%d over its registered "
                          "steps, up to %d with extra looks; shadow %d)", registered,
                          sum(sizes[1:]), sizes[0])
    return TrafficPlan(shadow=shadow, canary=list(zip(steps, canary, strict=True)),
                       longdoc=longdoc, longdoc_shadow=longdoc_shadow)


def _bucket_power(gated: Gated, longdoc: list[canary_source.LongdocStep]) -> str:
    """What the registered looks give each declared bucket, for the run log."""
    decision, plan = gated.thresholds.decision, gated.thresholds.canary
    if decision is None or not decision.buckets:
        return ""
    pairs = canary_source.expected_pairs(longdoc, [s.traffic_fraction for s in plan.steps],
                                         decision.buckets)
    claim, per = claim_power(decision.adoption_plan(), pairs, decision.bucket_min_pairs)
    return (f"; expected compared requests per bucket {pairs}, adoption power at the minimum "
            f"worthwhile effect {per} (the claim: {claim:.2f}; registered {decision.power:g})")
