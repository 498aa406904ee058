"""Which endpoints a shadow or canary step warms up (flows.traffic._warm_up): both where
the candidate's latency is judged, production alone where it is not (interpreted)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from flows import traffic


@pytest.mark.parametrize("assessed", [True, False])
def test_warm_up_serves_the_candidate_only_where_its_latency_is_judged(assessed, monkeypatch,
                                                                        caplog):
    warmed = []
    monkeypatch.setattr(traffic.serving, "warm_up",
                        lambda requests, endpoints, model: warmed.append(list(endpoints)))
    production = SimpleNamespace(name="xla (native baseline)")
    candidate = SimpleNamespace(name="pallas_tpu@v1")
    report = SimpleNamespace(speed_assessed=assessed,
                             speed_not_assessed_reason=None if assessed else "runs interpreted")
    with caplog.at_level(logging.INFO, logger="flows"):
        traffic._warm_up(SimpleNamespace(model="minilm"), SimpleNamespace(report=report),
                         SimpleNamespace(requests=["r"]), production, candidate)
    assert warmed == [[production, candidate] if assessed else [production]]
    said = "first request per length includes compiling it" in caplog.text
    assert said is not assessed


@pytest.mark.parametrize(("native", "target", "recorded"), [
    (True, "cpu", None), (False, "tpu", "generic_interpret"),
    # pallas_gpu interpreted on a CPU ignores the choice (always the generic lowering):
    # nothing recorded (it said the plan's interpreter, "tpu_interpret" under a strict one)
    (False, "gpu", None)])
def test_shadow_serves_under_the_registered_interpreter_and_records_it(native, target,
                                                                       recorded, monkeypatch):
    """The shadow stage warms up and replays inside the ``shadow`` interpreter of the
    registered thresholds the gate judged by (``gated.thresholds``; ``kernels.interpreters``),
    not of the file the session read before preregistering (it read the file
    when it opened; the registration may freeze an edited one), and the logged traffic names it for an interpreted TPU
    candidate (nothing for a native one)."""
    from evaluation.serving import TrafficResult
    from kernels import interpreters

    seen, logged = [], []
    result = TrafficResult(stage="shadow", fraction=0.0, candidate="pallas_tpu@v1",
                           production="xla", records=[], memory_start_bytes=0,
                           memory_end_bytes=0)
    monkeypatch.setattr(traffic, "_endpoints", lambda *a: ("production", "candidate"))
    monkeypatch.setattr(traffic, "_warm_up", lambda *a: seen.append(interpreters.current()))
    monkeypatch.setattr(traffic.serving, "replay_shadow",
                        lambda *a, **k: seen.append(interpreters.current()) or result)
    monkeypatch.setattr(traffic, "_judged", lambda gated, ev, res, step: res)
    store = SimpleNamespace(  # the family store's writes, recorded instead of signed
        assign_shadow=lambda version, **k: None, link_traffic_run=lambda *a: None,
        log_shadow=lambda version, res, judged, **k: logged.append(res))
    context = SimpleNamespace(record=SimpleNamespace(rollout_run_id="r"), store=store,
                              serving=SimpleNamespace())
    evaluated = SimpleNamespace(report=SimpleNamespace(candidate=SimpleNamespace(
        native=native, target_platform=target)))
    gated = SimpleNamespace(version="1", run_id="g",
                            thresholds=SimpleNamespace(serving_tpu_interpret_mode=False))
    traffic.shadow.fn(context, gated, evaluated, SimpleNamespace(requests=["a", "b"]))
    assert seen == ["generic_interpret", "generic_interpret"]
    assert interpreters.current() == "tpu_interpret"
    assert logged[0].interpreter == recorded
