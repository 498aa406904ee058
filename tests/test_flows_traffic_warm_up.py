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
