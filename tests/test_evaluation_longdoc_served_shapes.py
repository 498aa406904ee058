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
                            head_dim=32, dtype="float32", causal=False)
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
