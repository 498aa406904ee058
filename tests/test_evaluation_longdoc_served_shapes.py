"""The shapes a long-document replay served (``evaluation.longdoc.served_shapes``), and
dispatch evidence measured at them (``kernels.tools.dispatch_evidence --served-shapes``):
a bucket holding a served shape is measured there, every other bucket at its default
sizes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from evaluation.longdoc import served_shapes
from kernels.dispatch_pieces import EvidencePiece
from kernels.shapes import AttentionShape
from kernels.tools import dispatch_evidence
from tests.longdoc_synthetic import comparison, spec, write_spec

ROOT = Path(__file__).resolve().parents[1]
H100_RESULT = (ROOT / "kernels/tools/bench_results/h100-2026-12-06-longdoc-cudnn/policy/"
               "longdoc-pallas_mosaic_gpu-vs-policy.json")


def test_the_most_frequent_row_counts_are_kept_until_they_cover_the_share():
    counts = Counter({1: 50, 2: 30, 4: 15, 8: 5})
    assert served_shapes.kept_rows(counts, 0.8) == [1, 2]
    assert served_shapes.kept_rows(counts, 0.81) == [1, 2, 4]
    assert served_shapes.kept_rows(counts, 1.0) == [1, 2, 4, 8]
    assert served_shapes.kept_rows(Counter({4: 3, 2: 3}), 0.5) == [2]  # a tie: the smaller


def test_the_shapes_are_the_encoders_calls_per_bucket(tmp_path):
    workload = spec()
    path = write_spec(workload, tmp_path)
    result = tmp_path / "result.json"
    result.write_text(comparison(0.9, workload=workload, spec_path=path).model_dump_json())
    found = served_shapes.record(result, workload=path)
    shapes = [AttentionShape.model_validate(s) for s in found["shapes"]]
    enc = workload.encoder
    # the synthetic replay serves one request per batch: one row, every bucket it used
    assert {s.q_len for s in shapes} == {int(b) for b in found["batches"]}
    assert all(s.batch == 1 and s.kv_len == s.q_len and not s.causal for s in shapes)
    assert {(s.num_heads, s.num_kv_heads, s.head_dim, s.dtype) for s in shapes} == {
        (enc.heads, enc.heads, enc.head_dim, enc.dtype)}
    trace = json.loads(result.read_text())["reports"]["base"]["trace"]["batches"]
    assert sum(n for c in found["batches"].values() for n in c.values()) == len(trace)


def test_a_result_of_another_spec_or_no_result_is_refused(tmp_path, capsys):
    workload = spec()
    path = write_spec(workload, tmp_path)
    result = tmp_path / "result.json"
    result.write_text(comparison(0.9, workload=workload, spec_path=path).model_dump_json())
    path.write_text(path.read_text().replace("slo_s: 0.5", "slo_s: 0.6"))
    with pytest.raises(served_shapes.ServedShapesError, match="is not the spec the result served"):
        served_shapes.record(result, workload=path)
    stranger = tmp_path / "x.json"
    stranger.write_text("{}")
    assert served_shapes.main([str(stranger), "--out", str(tmp_path / "o.json")]) == 2
    assert "not a result of python -m evaluation.longdoc.bench" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_the_committed_h100_replay_served_batches_of_one_to_four_documents(tmp_path):
    out = tmp_path / "served.json"
    assert served_shapes.main([str(H100_RESULT), "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    rows = {}
    for s in found["shapes"]:
        assert (s["num_heads"], s["head_dim"], s["dtype"]) == (12, 64, "bfloat16")
        rows.setdefault(s["q_len"], []).append(s["batch"])
    assert rows == {1024: [1, 2], 2048: [1, 2], 4096: [1, 2], 8192: [1, 2],
                    16384: [1, 4], 32768: [1, 2]}


def test_evidence_is_measured_at_the_served_shapes_where_a_bucket_holds_them(tmp_path):
    """The tiny CPU grid (head_dim cut 48, sequence cut 32): one served shape in the
    bucket d[1, 48) q[32, inf) kv[32, inf) replaces its default shapes; every other
    bucket keeps them."""
    served = AttentionShape(batch=2, q_len=48, kv_len=48, num_heads=2, num_kv_heads=2,
                            head_dim=32, dtype="float32", causal=False, kv_fill=0.75)
    shapes_file = tmp_path / "served.json"
    shapes_file.write_text(json.dumps({"shapes": [served.model_dump(mode="json")]}))
    out = tmp_path / "piece"
    assert dispatch_evidence.main(["--out", str(out), "--quick", "--dtypes", "float32",
                                   "--causal", "full", "--kernels", "xla,naive",
                                   "--repeats", "3", "--slice-buckets", "0:",
                                   "--served-shapes", str(shapes_file)]) == 0
    piece = EvidencePiece.model_validate_json((out / "piece.json").read_text())
    holding = [b for b in piece.buckets if b.bucket.contains_shape(served)]
    assert len(holding) == 1 and holding[0].shapes == (served,)
    assert all(t.shape == served for k in holding[0].kernels for t in k.timings)
    others = [b for b in piece.buckets if b is not holding[0]]
    assert others and all(s.batch == 1 and s.num_heads == 2 and s != served
                          for b in others for s in b.shapes)


def test_another_workloads_spec_an_impossible_batch_and_an_unwritable_out_are_refused(
        tmp_path, capsys):
    """Found by trying to break it: a result without its spec's sha256 took another
    workload's spec; a batch of 0 rows and an --out onto a folder were tracebacks."""
    data = json.loads(H100_RESULT.read_text())
    nosha = tmp_path / "nosha.json"
    nosha.write_text(json.dumps({**data, "workload_sha256": None}))
    other = ROOT / "workloads/longdoc-modernbert-base-hd128.yaml"
    with pytest.raises(served_shapes.ServedShapesError, match="the result served"):
        served_shapes.record(nosha, workload=other)
    data["reports"][data["kernels"][0]]["trace"]["batches"][0]["rows"] = 0
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps(data))
    assert served_shapes.main([str(zero), "--out", str(tmp_path / "z.json"),
                               "--coverage", "1"]) == 2
    assert "gives no attention shape" in capsys.readouterr().err
    (tmp_path / "a-folder").mkdir()
    assert served_shapes.main([str(H100_RESULT), "--out", str(tmp_path / "a-folder")]) == 2
    assert capsys.readouterr().err.startswith("served_shapes: ")


@pytest.mark.parametrize(("content", "said"), [
    ('{"shapes": []}', "no shape given"),
    ('{"shapes": [{"batch": 0}]}', "shape 0: batch:"),
    ('{"shapes": "x"}', "'shapes' is not a list")])
def test_an_empty_or_malformed_served_shapes_file_is_named_in_one_line(tmp_path, capsys,
                                                                      content, said):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(SystemExit) as exit_:
        dispatch_evidence.main(["--list", "--quick", "--served-shapes", str(bad)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "errors.pydantic.dev" not in err


def test_served_shapes_outside_the_policys_space_are_refused_as_changing_nothing(capsys):
    committed = H100_RESULT.parent.parent / "served-shapes.json"  # bf16 shapes
    with pytest.raises(SystemExit) as exit_:
        dispatch_evidence.main(["--list", "--dtypes", "float16", "--served-shapes",
                                str(committed)])
    assert exit_.value.code == 2
    assert "the flag would change nothing" in capsys.readouterr().err


def test_each_served_shape_carries_its_documents_median_fill_of_the_bucket():
    """Recomputed here from the result's raw JSON: per (bucket, rows), the median of
    tokens / bucket over the documents of those batches."""
    found = served_shapes.record(H100_RESULT)
    raw = json.loads(H100_RESULT.read_text())
    trace = raw["reports"][raw["kernels"][0]]["trace"]  # the first kernel's replay
    tokens = {r["id"]: r["tokens"] for r in trace["requests"]}
    for s in found["shapes"]:
        shares = sorted(tokens[i] / s["kv_len"] for b in trace["batches"]
                        if b["bucket"] == s["kv_len"] and b["rows"] == s["batch"]
                        for i in b["request_ids"])
        n = len(shares)
        median = shares[n // 2] if n % 2 else (shares[n // 2 - 1] + shares[n // 2]) / 2
        assert s["kv_fill"] == pytest.approx(round(median, 2), abs=1e-9), s
        assert 0 < s["kv_fill"] < 1  # documents shorter than their bucket: padding to skip


def test_a_shape_without_a_fill_dumps_as_before_and_keeps_committed_fingerprints():
    """A committed policy (made before shapes had a fill) still has the fingerprint its
    merge printed; a fill gives every row the same length, at least one key."""
    from kernels.dispatch_policy import DispatchPolicy

    committed = ROOT / "kernels/tools/bench_results/h100-2026-12-06-served-shape-policy"
    policy = DispatchPolicy.model_validate_json((committed / "policy.json").read_text())
    assert policy.fingerprint() == ("9285efbe6be2d4a1e34b9bdbb4a99c79"
                                    "7491708955fcaf2597c8dcc3b04aa9b6")
    bare = AttentionShape(batch=2, q_len=64, kv_len=100, num_heads=2, num_kv_heads=2,
                          head_dim=32)
    assert "kv_fill" not in bare.model_dump() and bare.kv_lengths() is None
    filled = bare.model_copy(update={"kv_fill": 0.5})
    assert filled.model_dump()["kv_fill"] == 0.5 and "fill 0.5" in filled.label
    assert filled.kv_lengths().tolist() == [50, 50]
    assert bare.model_copy(update={"kv_fill": 0.001}).kv_lengths().tolist() == [1, 1]
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="kv_fill"):
            AttentionShape(**bare.model_dump(), kv_fill=bad)


def test_a_filled_shape_is_timed_with_its_padding_masked():
    """The benchmark's call for a shape with a fill passes the lengths: keys past them
    change nothing, while the bare shape's call sees them."""
    import jax.numpy as jnp
    import numpy as np

    from kernels.shapes import random_inputs
    from kernels.tools.bench import attention_fn

    bare = AttentionShape(batch=2, q_len=48, kv_len=64, num_heads=2, num_kv_heads=2,
                          head_dim=32, dtype="float32")
    filled = bare.model_copy(update={"kv_fill": 0.5})
    q, k, v = random_inputs(bare, 7)
    garbage_k, garbage_v = k.at[:, 32:].set(30.0), v.at[:, 32:].set(-50.0)
    call = attention_fn("xla", filled, None)
    np.testing.assert_array_equal(np.asarray(call(q, k, v)),
                                  np.asarray(call(q, garbage_k, garbage_v)))
    seen = attention_fn("xla", bare, None)
    assert not np.allclose(np.asarray(seen(q, k, v)), np.asarray(seen(q, garbage_k, garbage_v)))
    assert jnp.isfinite(call(q, k, v)).all()


def test_a_filled_shape_is_checked_against_the_reference_with_its_lengths():
    """The benchmark compares each kernel with float64 attention over the same keys the
    kernel saw: with a fill, the reference masks the padding too (without, the error is
    O(1) and a correct kernel is marked wrong)."""
    from kernels.tools.bench import bench_shape

    filled = AttentionShape(batch=2, q_len=64, kv_len=128, num_heads=2, num_kv_heads=2,
                            head_dim=32, dtype="float32", kv_fill=0.5)
    (row,) = bench_shape(filled, ["xla"], seed=0, ceiling=1e12, repeats=3,
                         target_repeat_s=0.001, warmup_s=0.0)
    assert row.rel_error_vs_reference < 1e-5 and row.correct


@pytest.mark.parametrize("fill, kv_len, valid", [(0.07, 100, 7), (0.14, 100, 14),
                                                 (0.55, 100, 55), (0.17, 300, 51),
                                                 (0.505, 100, 51), (0.001, 50, 1)])
def test_a_fill_gives_the_ceiling_of_its_share_of_the_keys(fill, kv_len, valid):
    shape = AttentionShape(batch=1, q_len=8, kv_len=kv_len, num_heads=1, num_kv_heads=1,
                           head_dim=8, kv_fill=fill)
    assert shape.kv_lengths().tolist() == [valid]
    with pytest.raises(ValueError, match="kv_fill"):
        AttentionShape(**shape.model_dump(exclude={"kv_fill"}), kv_fill=True)


def test_the_evaluation_runner_times_a_filled_shape_with_its_lengths():
    """The gate's latency shapes go through ``LocalRunner.compile_for``: the attention it
    compiles receives the shape's ``kv_lengths``, and none for a bare shape."""
    import numpy as np

    from evaluation.runners import LocalRunner

    seen = []

    def attention_fn(q, k, v, *, causal, scale, q_lengths, kv_lengths):
        seen.append(None if kv_lengths is None else np.asarray(kv_lengths).tolist())
        return q

    runner = LocalRunner("recorder", attention_fn)
    bare = AttentionShape(batch=2, q_len=16, kv_len=40, num_heads=1, num_kv_heads=1,
                          head_dim=8)
    runner.compile_for(bare, 0)
    runner.compile_for(bare.model_copy(update={"kv_fill": 0.25}), 0)
    assert seen == [None, [10, 10]]
