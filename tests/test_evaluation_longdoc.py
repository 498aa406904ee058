"""The long-document workload: spec, arrivals, encoder, batcher, replay, report, server.

The encoder's attention is checked against the float64 reference on its own q/k/v; the
batcher's invariants over a whole replay; queue and compute times against an injected
service time, where they are known exactly; the report's figures against a tiny trace
computed by hand (the numbers in the comments)."""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from evaluation.longdoc.arrivals import Request, draw_requests
from evaluation.longdoc.batcher import Batch, bucket_of, next_batch
from evaluation.longdoc.encoder import LongDocEncoder, init_params, layer_qkv_jit, weights_sha256
from evaluation.longdoc.loadgen import BatchOutcome, replay
from evaluation.longdoc.report import nearest_rank, summarise
from evaluation.longdoc.spec import (
    EncoderSpec,
    InvalidWorkload,
    WorkloadSpec,
    load_spec,
    max_rows,
    shipped,
)
from kernels.dispatch import get_attention_fn
from kernels.reference import attention_reference, relative_error, rounding_floor

TINY_ENCODER = {"layers": 2, "hidden": 64, "heads": 2, "head_dim": 32, "mlp_hidden": 96,
                "vocab": 97, "seed": 3}


def _spec(**over) -> WorkloadSpec:
    raw = {"name": "tiny", "encoder": TINY_ENCODER,
           "lengths": {"kind": "lognormal", "median_tokens": 12, "sigma": 0.7,
                       "min_tokens": 2, "max_tokens": 32},
           "arrivals": {"rate_per_s": 50.0, "requests": 40, "warmup_requests": 4, "seed": 5},
           "buckets": [8, 16, 32], "max_batch_tokens": 64, "slo_s": 1.0,
           "price_per_device_hour": 3600.0}
    raw.update(over)
    return WorkloadSpec.model_validate(raw)


# ------------------------------------------------------------------------------ spec


def test_shipped_specs_load_and_the_gpu_ones_reach_32k_tokens():
    small = load_spec(shipped("longdoc-cpu-small"))
    assert small.encoder.layers == 2 and small.encoder.hidden == 128
    assert small.lengths.max_tokens <= 512
    for name, head_dim in (("longdoc-modernbert-base", 64),
                           ("longdoc-modernbert-base-hd128", 128)):
        spec = load_spec(shipped(name))
        assert (spec.encoder.layers, spec.encoder.hidden, spec.encoder.head_dim) == (
            22, 768, head_dim)
        assert spec.lengths.max_tokens == 32768 and spec.buckets[-1] == 32768
    with pytest.raises(InvalidWorkload, match="no shipped workload"):
        shipped("nope")


@pytest.mark.parametrize(("over", "message"), [
    ({"buckets": [16, 8, 32]}, "strictly increasing"),
    ({"buckets": [8, 16]}, "exceeds the largest bucket"),
    ({"max_batch_tokens": 16}, "must hold one request of the largest bucket"),
    ({"encoder": {**TINY_ENCODER, "head_dim": 20}}, "multiple of 8"),
    ({"arrivals": {"rate_per_s": 1.0, "requests": 4, "warmup_requests": 4}},
     "warmup_requests"),
    ({"slo_s": 0}, "greater than 0"),
])
def test_a_bad_spec_is_refused_naming_the_constraint(over, message):
    with pytest.raises(ValueError, match=message):
        _spec(**over)


def test_a_bad_file_is_refused_naming_the_file(tmp_path: Path):
    path = tmp_path / "w.yaml"
    path.write_text("name: x\nbuckets: [8]\n")
    with pytest.raises(InvalidWorkload, match=r"w\.yaml: .*encoder"):
        load_spec(path)
    path.write_text("- a list\n")
    with pytest.raises(InvalidWorkload, match="a mapping"):
        load_spec(path)


# -------------------------------------------------------------------------- arrivals


def test_arrivals_are_determined_by_the_seed_and_open_loop():
    spec = _spec(arrivals={"rate_per_s": 20.0, "requests": 4000, "seed": 9})
    a, b = draw_requests(spec), draw_requests(spec)
    assert a == b
    other = draw_requests(spec.model_copy(update={"arrivals": spec.arrivals.model_copy(
        update={"seed": 10})}))
    assert [r.arrival_s for r in other] != [r.arrival_s for r in a]
    times = np.array([r.arrival_s for r in a])
    tokens = np.array([r.tokens for r in a])
    assert np.all(np.diff(times) > 0) and [r.id for r in a] == list(range(4000))
    assert tokens.min() >= 2 and tokens.max() <= 32
    # Poisson at 20/s: mean gap 0.05 s (sd of the mean 0.05/sqrt(4000) = 0.0008)
    assert abs(np.diff(times, prepend=0.0).mean() - 0.05) < 0.004
    # a rate override scales the same gaps and keeps the same documents
    faster = draw_requests(spec, rate_per_s=40.0)
    assert np.allclose([r.arrival_s for r in faster], times / 2)
    assert [r.tokens for r in faster] == tokens.tolist()
    with pytest.raises(ValueError, match="rate_per_s"):
        draw_requests(spec, rate_per_s=0.0)


def test_histogram_lengths_stay_in_their_bins():
    spec = _spec(lengths={"kind": "histogram", "min_tokens": 2, "max_tokens": 32,
                          "bins": [{"low": 2, "high": 4, "weight": 1},
                                   {"low": 30, "high": 32, "weight": 3}]},
                 arrivals={"rate_per_s": 1.0, "requests": 2000})
    tokens = np.array([r.tokens for r in draw_requests(spec)])
    assert np.all((tokens <= 4) | (tokens >= 30))
    assert 0.7 < np.mean(tokens >= 30) < 0.8  # weight 3 of 4


# --------------------------------------------------------------------------- encoder


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_encoder_attention_matches_float64_on_its_own_qkv(dtype):
    spec = EncoderSpec(**{**TINY_ENCODER, "dtype": dtype})
    encoder = LongDocEncoder(spec)
    rng = np.random.default_rng(2024)
    ids = jnp.asarray(rng.integers(0, spec.vocab, (2, 64), dtype=np.int32))
    lengths = jnp.asarray(np.array([64, 37], dtype=np.int32))  # one padded row
    fn = get_attention_fn("xla")
    for layer in range(spec.layers):
        q, k, v = layer_qkv_jit(encoder.params, ids, lengths, attention_fn=fn, spec=spec,
                                layer=layer)
        assert q.dtype == jnp.dtype(dtype) and q.shape == (2, 64, 2, 32)
        out = fn(q, k, v, causal=False, scale=None, q_lengths=None, kv_lengths=lengths)
        ref = attention_reference(q, k, v, kv_lengths=np.asarray(lengths))
        err = relative_error(np.asarray(out, dtype=np.float64), ref)
        assert err <= 2 * rounding_floor(dtype, 64), (layer, err)
        assert np.std(np.asarray(ref)) > 1e-3  # not a degenerate (constant) attention


def test_the_weights_fingerprint_follows_the_seed_and_the_dtype():
    spec = EncoderSpec(**TINY_ENCODER)
    same = weights_sha256(init_params(spec))
    assert same == LongDocEncoder(spec).weights_sha256
    assert weights_sha256(init_params(spec.model_copy(update={"seed": 4}))) != same
    assert weights_sha256(init_params(spec.model_copy(update={"dtype": "bfloat16"}))) != same
    assert spec.parameter_count() == sum(
        np.asarray(x).size for x in __import__("jax").tree_util.tree_leaves(init_params(spec)))


# --------------------------------------------------------------------------- batcher


def _fake(seconds_per_token: float):
    def serve(batch: Batch) -> BatchOutcome:
        return BatchOutcome(seconds_per_token * batch.padded_tokens,
                            tuple(True for _ in batch.requests))
    return serve


def test_the_batcher_serves_every_request_once_padded_within_its_bucket_and_budget():
    spec = _spec(arrivals={"rate_per_s": 400.0, "requests": 600, "seed": 1})
    requests = draw_requests(spec)
    trace = replay(requests, spec, _fake(2e-4))  # about 1.2x overloaded
    served = [i for b in trace.batches for i in b.request_ids]
    assert sorted(served) == list(range(600))
    by_id = {r.id: r for r in requests}
    assert sum(len(b.request_ids) > 1 for b in trace.batches) > 20  # batching happened
    for b in trace.batches:
        members = [by_id[i] for i in b.request_ids]
        assert all(bucket_of(r.tokens, spec.buckets) == b.bucket for r in members)
        assert all(r.tokens <= b.bucket for r in members)
        assert b.rows & (b.rows - 1) == 0 and len(members) <= b.rows <= max_rows(spec, b.bucket)
        assert b.rows * b.bucket <= spec.max_batch_tokens
        assert all(r.arrival_s <= b.start_s for r in members)
        assert [r.id for r in members] == sorted(r.id for r in members)
    starts = [b.start_s for b in trace.batches]
    assert all(y >= x for x, y in zip(starts, starts[1:], strict=False))


def test_the_oldest_waiting_request_picks_the_bucket():
    spec = _spec()
    waiting = [Request(0, 0.0, 20), Request(1, 0.1, 3), Request(2, 0.2, 30), Request(3, 0.3, 25)]
    batch = next_batch(waiting, spec)
    assert batch.bucket == 32 and [r.id for r in batch.requests] == [0, 2]  # 2 rows of 32
    assert batch.rows == 2 == max_rows(spec, 32)
    with pytest.raises(ValueError, match="fits no bucket"):
        bucket_of(33, spec.buckets)


# ---------------------------------------------------------------- replay and report


def test_queue_and_compute_are_apart_and_exact_under_an_injected_service_time():
    # one row per batch (budget = largest bucket), a batch every 0.25 s, an arrival every
    # 0.1 s: request i starts at 0.1 + 0.25 i, so it queues 0.15 i and computes 0.25
    spec = _spec(max_batch_tokens=32)
    requests = [Request(i, 0.1 * (i + 1), 20) for i in range(10)]
    trace = replay(requests, spec, lambda b: BatchOutcome(0.25, (True,)))
    for i, r in enumerate(trace.requests):
        assert r.queue_s == pytest.approx(0.15 * i)
        assert r.compute_s == 0.25
        assert r.time_to_result_s == pytest.approx(0.15 * i + 0.25)


HAND = [Request(0, 0.5, 3), Request(1, 0.6, 4), Request(2, 0.7, 2), Request(3, 0.8, 7),
        Request(4, 2.0, 3)]
"""Buckets 4 and 8, budget 16, 0.5 s per batch: B0 {0} runs 0.5-1.0; at 1.0 requests 1, 2
(bucket 4) and 3 (bucket 8) wait, the oldest is bucket 4: B1 {1, 2} 1.0-1.5; B2 {3}
1.5-2.0; B3 {4} 2.0-2.5. Queue 0, 0.4, 0.3, 0.7, 0; time to result 0.5, 0.9, 0.8, 1.2, 0.5."""


def _hand_spec() -> WorkloadSpec:
    return _spec(buckets=[4, 8], max_batch_tokens=16, slo_s=1.0, price_per_device_hour=3600.0,
                 lengths={"kind": "lognormal", "median_tokens": 3, "sigma": 0.5,
                          "min_tokens": 1, "max_tokens": 8},
                 arrivals={"rate_per_s": 1.0, "requests": 5, "warmup_requests": 1})


def test_the_report_matches_figures_computed_by_hand():
    spec = _hand_spec()
    trace = replay(HAND, spec, lambda b: BatchOutcome(0.5, (True,) * len(b.requests)))
    assert [b.request_ids for b in trace.batches] == [[0], [1, 2], [3], [4]]
    assert [b.rows for b in trace.batches] == [1, 2, 1, 1]
    assert [r.queue_s for r in trace.requests] == pytest.approx([0, 0.4, 0.3, 0.7, 0])
    report = summarise(trace, spec, implementation="fake", device="none")
    o = report.overall
    # steady: requests 1-4; window: 0.6 (request 1 arrives) to 2.0 (the last arrival)
    assert report.window_s == pytest.approx(1.4)
    assert o.requests == 4
    assert (o.p50_s, o.p95_s, o.p99_s) == pytest.approx((0.8, 1.2, 1.2))  # of .5 .8 .9 1.2
    assert o.docs_per_s == pytest.approx(4 / 1.4)  # results at 1.0, 1.5, 1.5, 2.0
    assert o.tokens_per_s == pytest.approx((3 + 4 + 2 + 7) / 1.4)
    assert o.goodput_docs_per_s == pytest.approx(3 / 1.4)  # request 3 took 1.2 s > SLO
    assert o.slo_attainment == pytest.approx(3 / 4)
    assert o.busy_fraction == pytest.approx(1.0)  # 0.4 + 0.5 + 0.5 of 1.4 s
    assert o.device_s == pytest.approx(2.0)
    assert o.cost_per_1000_docs == pytest.approx(2.0 / 5 * 1000)  # price 1/s
    b4, b8 = report.buckets[4], report.buckets[8]
    assert (b4.requests, b4.p50_s, b4.busy_fraction) == (3, pytest.approx(0.8),
                                                         pytest.approx(0.9 / 1.4))
    assert b4.cost_per_1000_docs == pytest.approx(1.5 / 4 * 1000)
    assert (b8.requests, b8.p99_s, b8.docs_per_s) == (1, pytest.approx(1.2),
                                                       pytest.approx(1 / 1.4))
    assert report.device_peak_bytes is None


def test_errors_and_non_finite_outputs_are_counted_not_raised():
    spec = _hand_spec()

    def serve(batch):
        if batch.bucket == 8:
            return BatchOutcome(0.5, None, "RuntimeError: out of memory")
        return BatchOutcome(0.5, tuple(r.id != 2 for r in batch.requests))

    report = summarise(replay(HAND, spec, serve), spec, implementation="fake", device="none")
    o = report.overall
    assert (o.errors, o.non_finite) == (1, 1)
    assert o.docs_per_s == pytest.approx(3 / 1.4)  # requests 0-2 (3 failed)
    assert o.goodput_docs_per_s == pytest.approx(2 / 1.4)  # requests 0 and 1
    assert o.cost_per_1000_docs == pytest.approx(2.0 / 4 * 1000)  # 4 served without error
    assert report.trace.requests[3].error == "RuntimeError: out of memory"


def test_replay_refuses_bad_input():
    spec = _hand_spec()
    with pytest.raises(ValueError, match="sorted by arrival"):
        replay(list(reversed(HAND)), spec, lambda b: BatchOutcome(0.1, (True,)))
    with pytest.raises(ValueError, match="fits no bucket"):
        replay([Request(0, 0.0, 9)], spec, lambda b: BatchOutcome(0.1, (True,)))
    with pytest.raises(ValueError, match="finite and >= 0"):
        replay(HAND, spec, lambda b: BatchOutcome(math.nan, (True,)))
    assert nearest_rank([], 0.5) is None and nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0


# ---------------------------------------------------------------------------- server


def test_a_real_replay_on_this_host_with_a_failing_and_a_nan_kernel():
    from evaluation.longdoc.run import serve_workload

    spec = _spec(arrivals={"rate_per_s": 50.0, "requests": 16, "warmup_requests": 2, "seed": 5})
    report, server = serve_workload(spec, "xla")
    assert report.overall.errors == 0 and report.overall.non_finite == 0
    assert report.overall.requests == 14 and report.weights_sha256
    assert all(r.compute_s > 0 for r in report.trace.requests)
    assert report.compile_s > 0 and report.compiled_peak_bytes
    naive_report, naive_server = serve_workload(spec, "naive")
    for i, out in server.outputs.items():  # same documents on both kernels
        other = naive_server.outputs[i]
        cos = float(out @ other / (np.linalg.norm(out) * np.linalg.norm(other)))
        assert cos > 0.9999, (i, cos)

    xla = get_attention_fn("xla")

    def broken(q, k, v, **kw):
        if q.shape[1] == 32:
            raise RuntimeError("no kernel for 32 keys")
        out = xla(q, k, v, **kw)
        return jnp.where(q.shape[1] == 16, jnp.nan, out)

    bad, _ = serve_workload(spec, "broken", attention_fn=broken)
    counts = {b: sum(r.bucket == b for r in bad.trace.requests) for b in spec.buckets}
    assert bad.overall.errors == counts[32] > 0
    assert bad.overall.non_finite == counts[16] > 0
    assert "no kernel for 32 keys" in next(r.error for r in bad.trace.requests if r.bucket == 32)


def test_the_bench_command_pairs_two_kernels_and_writes_json(tmp_path: Path, capsys):
    import json

    import yaml

    from evaluation.longdoc import bench

    raw = _spec(arrivals={"rate_per_s": 50.0, "requests": 12, "warmup_requests": 2,
                          "seed": 5}).model_dump(mode="json")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "bench.json"
    assert bench.main(["--workload", str(path), "--kernels", "xla,naive",
                       "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ttr ratio" in text and "naive / xla" in text
    data = json.loads(out.read_text())
    assert data["kernels"] == ["xla", "naive"] and set(data["paired"]) >= {"all"}
    assert data["paired"]["all"]["min_output_cosine"] > 0.9999
    ids = [[r["id"] for r in data["reports"][k]["trace"]["requests"]] for k in ("xla", "naive")]
    assert ids[0] == ids[1] == list(range(12))  # paired on the same arrivals
    with pytest.raises(SystemExit):
        bench.main(["--help"])
