"""Dispatch evidence in pieces: a slice of the grid measured as a piece, the pieces merged
into the evidence of the whole space (the same in any order, and the same as the whole
evidence they were cut from), and pieces that are not one measurement refused by name
(another device, backend, method, software or space; overlapping buckets; a gap). The
tool end to end on a CPU with the tiny plan.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.dispatch_audit import load_policy
from kernels.dispatch_pieces import EvidencePiece, PieceError, merge_pieces
from kernels.dispatch_policy import Evidence, Rule, choose_buckets, derive_policy
from kernels.dispatch_space import BucketGrid, Region
from kernels.tools import dispatch_evidence, dispatch_merge
from tests.test_kernels_dispatch_policy import MEASURED, make_evidence

WHOLE = make_evidence(MEASURED)
"""Stand-in evidence of four buckets (``tests.test_kernels_dispatch_policy``)."""


def _piece(label: str, indices: tuple[int, ...], **fields) -> EvidencePiece:
    """The buckets ``indices`` of :data:`WHOLE` as a piece, ``fields`` changed."""
    data = {"label": label, "space": WHOLE.space, "device": WHOLE.device,
            "backend": WHOLE.backend, "method": WHOLE.method,
            "software": {"jax": "0.0-stand-in"},
            "buckets": tuple(WHOLE.buckets[i] for i in indices)}
    return EvidencePiece(**{**data, **fields})


def test_pieces_merge_into_the_whole_evidence_in_any_order():
    pieces = [_piece("a", (3, 0)), _piece("b", (2,)), _piece("c", (1,))]
    merged = merge_pieces(pieces)
    assert merged == Evidence(**{**WHOLE.__dict__, "software": {"jax": "0.0-stand-in"}})
    assert merge_pieces(pieces[::-1]).fingerprint() == merged.fingerprint()
    assert merge_pieces([_piece("all", (0, 1, 2, 3))]) == merged


@pytest.mark.parametrize("field, value", [
    ("device", "another GPU"), ("backend", "tpu"), ("method", "other timings"),
    ("software", {"jax": "0.0-other"}), ("space", Region(dtypes=("float32",)))])
def test_pieces_from_another_device_method_software_or_space_are_refused(field, value):
    other = _piece("b", (2, 3), **{field: value}) if field != "space" else _piece(
        "b", (2, 3), space=value)
    with pytest.raises(PieceError, match=f"pieces 'a' and 'b' differ in {field}: "):
        merge_pieces([_piece("a", (0, 1)), other])


def test_pieces_that_overlap_or_leave_a_gap_are_refused():
    with pytest.raises(PieceError, match=r"pieces 'a' and 'b' both measure 'float32 full "
                                         r"d\[1, 48\) q\[1, 32\)"):
        merge_pieces([_piece("a", (0, 1)), _piece("b", (0, 2, 3))])
    with pytest.raises(PieceError, match=r"do not make the whole space: no bucket covers "
                                         r"float32 full head_dim \[48, inf\) q_len \[32, inf\)"):
        merge_pieces([_piece("a", (0, 1)), _piece("b", (2,))])
    with pytest.raises(PieceError, match="no pieces"):
        merge_pieces([])
    with pytest.raises(ValueError, match="overlap"):
        _piece("a", (0, 0))


def _slice(tmp_path, name: str, *flags: str) -> EvidencePiece:
    out = tmp_path / name
    assert dispatch_evidence.main(["--out", str(out), "--quick", "--dtypes", "float32",
                                   "--causal", "full", "--kernels", "xla,naive",
                                   "--repeats", "3", *flags]) == 0
    assert not (out / "policy.json").exists()
    return EvidencePiece.model_validate_json((out / "piece.json").read_text())


def test_the_tool_measures_slices_and_the_merge_derives_the_policy_of_the_whole(
        tmp_path, capsys):
    first = _slice(tmp_path, "first", "--slice-buckets", "0:3")
    rest = _slice(tmp_path, "rest", "--slice-buckets", "3:")
    grid = BucketGrid(space=Region(dtypes=("float32",), causal=(False,)),
                      head_dim_cuts=(48,), seq_cuts=(32,))
    assert [b.bucket for b in first.buckets + rest.buckets] == list(grid.buckets())
    assert first.space == rest.space == grid.space
    assert first.label == "buckets 0:3" and first.software["kernels_source_sha256"]
    assert "jax" in first.software and "hash of the bucket's name" in first.method
    out = tmp_path / "merged"
    code = dispatch_merge.main([str(tmp_path / "rest" / "piece.json"),
                                str(tmp_path / "first" / "piece.json"), "--out", str(out)])
    assert code == 0
    evidence = Evidence.model_validate_json((out / "evidence.json").read_text())
    assert evidence == merge_pieces([first, rest])
    policy = load_policy(out / "policy.json")  # audited
    assert policy == derive_policy(evidence, ("xla", "naive"), Rule(priority=("xla", "naive")))
    assert policy.software == first.software
    assert capsys.readouterr().out.count("-> ") == 8


def test_a_slice_by_dtype_and_causal_flag_selects_those_buckets_of_the_whole_grid():
    parser = dispatch_evidence.build_parser()
    args = parser.parse_args(["--out", "x", "--quick", "--slice-dtypes", "bfloat16",
                              "--slice-causal", "causal"])
    plan = dispatch_evidence.plan_from(args, "cpu")
    buckets, label = dispatch_evidence.select(plan.grid, args)
    assert label == "bfloat16 causal" and len(buckets) == 8
    assert all(b.dtypes == ("bfloat16",) and b.causal == (True,) for b in buckets)
    assert plan.grid.space == Region()  # a piece of the whole space
    assert dispatch_evidence.select(plan.grid, parser.parse_args(["--out", "x"])) is None


def test_the_merge_refuses_overlapping_slices_and_says_why(tmp_path, capsys):
    _slice(tmp_path, "first", "--slice-buckets", "0:2")
    _slice(tmp_path, "second", "--slice-buckets", "1:3")
    code = dispatch_merge.main([str(tmp_path / "first" / "piece.json"),
                                str(tmp_path / "second" / "piece.json"),
                                "--out", str(tmp_path / "merged")])
    assert code == 3
    err = capsys.readouterr().err
    assert "pieces 'buckets 0:2' and 'buckets 1:3' both measure 'float32 full" in err
    assert not (tmp_path / "merged").exists()


def test_the_tool_lists_the_grids_buckets_and_refuses_an_empty_slice(tmp_path, capsys):
    assert dispatch_evidence.main(["--out", str(tmp_path), "--quick", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 3 * 2 * 8 and listed[0].startswith("   0 float32 full")
    assert dispatch_evidence.main(["--out", str(tmp_path), "--list", "--dtypes",
                                   "bfloat16"]) == 0  # the accelerator's grid, on a CPU
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 54 and listed[27].startswith(
        "  27 bfloat16 causal d[1, 65) q[1, 1024) kv[1, 1024)")
    with pytest.raises(SystemExit) as exit_info:  # a usage error naming it, no traceback
        dispatch_evidence.main(["--out", str(tmp_path / "none"), "--quick", "--dtypes",
                                "float32", "--slice-dtypes", "bfloat16"])
    assert exit_info.value.code == 2 and "selects no bucket" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_a_partial_merge_shows_the_measured_buckets_names_the_gap_and_writes_nothing(
        tmp_path, capsys, monkeypatch):
    first = _slice(tmp_path, "first", "--slice-buckets", "0:3")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert dispatch_merge.main([str(tmp_path / "first" / "piece.json"), "--partial"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PARTIAL: 3 buckets measured by pieces ['buckets 0:3']")
    assert "no policy is derived or written: no bucket covers float32 full" in out
    assert out.count("-> ") == 3  # the three measured buckets' choices, as --out prints them
    chosen = choose_buckets(first.buckets, ("xla", "naive"), Rule(priority=("xla", "naive")))
    assert [line.split(" -> ")[1].split()[0] for line in out.splitlines() if " -> " in line] \
        == [c.kernel for c in chosen]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    # the partial table's choices are the policy's: on a whole space they agree bucket by bucket
    rest = _slice(tmp_path, "rest", "--slice-buckets", "3:")
    evidence = merge_pieces([first, rest])
    rule = Rule(priority=("xla", "naive"))
    assert choose_buckets(evidence.buckets, ("xla", "naive"), rule) == \
        derive_policy(evidence, ("xla", "naive"), rule).buckets
    with pytest.raises(SystemExit):  # a partial table and a policy folder are exclusive
        dispatch_merge.main([str(tmp_path / "first" / "piece.json"), "--partial",
                             "--out", str(tmp_path / "x")])
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # a candidate with no capability: named
        dispatch_merge.main([str(tmp_path / "first" / "piece.json"), "--partial",
                             "--kernels", "xla,bogus"])
    assert refused.value.code == 2 and "['bogus'] have no declared capability" in \
        capsys.readouterr().err


def test_a_time_budget_cuts_a_slice_between_buckets_and_names_the_rest(tmp_path, capsys):
    """A budget no second bucket fits keeps the first bucket only, says so in the label,
    prints the --slice-buckets of the rest; that rest merges with it into the whole."""
    cut = _slice(tmp_path, "cut", "--slice-buckets", "0:", "--budget-s", "0")
    printed = capsys.readouterr().out
    assert len(cut.buckets) == 1 and "cut at the time budget: 1 of 8 buckets" in cut.label
    assert "--slice-buckets 1: measures it" in printed
    rest = _slice(tmp_path, "rest", "--slice-buckets", "1:")
    assert "not measured yet" not in capsys.readouterr().out
    assert dispatch_merge.main([str(tmp_path / "cut" / "piece.json"),
                                str(tmp_path / "rest" / "piece.json"),
                                "--out", str(tmp_path / "merged")]) == 0
    assert len(merge_pieces([cut, rest]).buckets) == 8


def test_a_time_budget_without_a_slice_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        dispatch_evidence.main(["--out", str(tmp_path), "--quick", "--budget-s", "10"])
    assert exit_info.value.code == 2
    assert "--budget-s measures a piece" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("budget", ["-5", "nan", "inf"])
def test_a_negative_or_non_finite_budget_is_a_usage_error(tmp_path, capsys, budget):
    with pytest.raises(SystemExit) as exit_info:
        dispatch_evidence.main(["--out", str(tmp_path / "out"), "--quick",
                                "--slice-buckets", "0:", "--budget-s", budget])
    assert exit_info.value.code == 2
    assert "--budget-s" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_value_the_plan_refuses_is_a_usage_error_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        dispatch_evidence.main(["--out", str(tmp_path / "out"), "--quick",
                                "--slice-buckets", "0:1", "--repeats", "0"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "repeats" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", ["not json", '{"version": 1}'])
def test_the_merge_names_a_file_that_is_not_a_piece(tmp_path, capsys, content):
    (tmp_path / "policy.json").write_text(content)
    assert dispatch_merge.main([str(tmp_path / "policy.json"), "--out",
                                str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert f"{tmp_path / 'policy.json'}: not a dispatch evidence piece" in err, err
    assert "errors.pydantic.dev" not in err and not (tmp_path / "out").exists()


def test_an_out_folder_that_cannot_be_made_is_refused_before_measuring_or_merging(
        tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        dispatch_evidence.main(["--out", str(blocker), "--quick", "--slice-buckets", "0:1"])
    printed = capsys.readouterr()
    assert exit_info.value.code == 2 and f"cannot write {blocker}" in printed.err, printed
    assert "[dispatch_evidence]" not in printed.out + printed.err  # before any measurement
    _slice(tmp_path, "whole", "--slice-buckets", "0:")
    with pytest.raises(SystemExit) as exit_info:
        dispatch_merge.main([str(tmp_path / "whole" / "piece.json"), "--out", str(blocker)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"cannot write {blocker}" in err, err


def _whole_piece(tmp_path):
    path = tmp_path / "whole.json"
    path.write_text(_piece("all", (0, 1, 2, 3)).model_dump_json())
    return str(path)


def test_the_merge_writes_no_lone_evidence_when_the_policy_cannot_be_written(
        tmp_path, capsys):
    out = tmp_path / "out"
    (out / "policy.json").mkdir(parents=True)  # policy.json cannot be replaced by a file
    with pytest.raises(SystemExit) as exit_info:
        dispatch_merge.main([_whole_piece(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "policy.json" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["policy.json"]  # no evidence, no temps
    assert (out / "policy.json").is_dir()


def test_a_failed_merge_leaves_the_previous_evidence_and_policy_as_they_were(
        tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    # 2: the stand-in has a bucket no kernel serves; both files are written all the same
    assert dispatch_merge.main([_whole_piece(tmp_path), "--out", str(out)]) == 2
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["evidence.json", "policy.json"]
    real_replace = dispatch_merge.os.replace

    def replace_failing_for_the_policy(src, dst):
        if Path(dst).name == "policy.json":
            raise OSError(28, "No space left on device", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(dispatch_merge.os, "replace", replace_failing_for_the_policy)
    with pytest.raises(SystemExit) as exit_info:  # another priority: another policy
        dispatch_merge.main([_whole_piece(tmp_path), "--out", str(out), "--kernels",
                             "naive,xla"])
    assert exit_info.value.code == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_unknown_kernel_is_a_usage_error_naming_it_and_the_known_ones_before_measuring(
        tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        dispatch_evidence.main(["--out", str(tmp_path / "out"), "--quick",
                                "--kernels", "xla,bogus,naive,nope"])
    printed = capsys.readouterr()
    assert exit_info.value.code == 2, printed
    assert "argument --kernels: unknown kernels 'bogus', 'nope'; known kernels: " \
        in printed.err, printed.err
    known = printed.err.split("known kernels: ")[1].split(", ")
    assert {"naive", "xla", "cudnn", "tokamax"} <= {k.strip() for k in known}
    assert "[dispatch_evidence]" not in printed.out + printed.err  # nothing measured
    assert not (tmp_path / "out").exists()


def test_the_grids_cuts_are_flags_and_a_bad_cut_is_named(tmp_path, capsys):
    """A finer space is data on the command line: a cut at 2048 splits the 1k-8k buckets
    (where, on an H100, ``pallas_gpu`` led at 1-2k and ``pallas_mosaic_gpu`` from 4k),
    a batch cut doubles every bucket."""
    base = ["--out", str(tmp_path), "--list", "--dtypes", "bfloat16", "--causal", "full"]
    assert dispatch_evidence.main([*base, "--seq-cuts", "1024,2048,8192"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 3 * 4 * 4  # head_dim ranges x q ranges x kv ranges
    assert any("bfloat16 full d[1, 65) q[1024, 2048) kv[1024, 2048) b[1, inf)" in line
               for line in listed)
    assert dispatch_evidence.main([*base, "--seq-cuts", "1024,2048,8192",
                                   "--batch-cuts", "2"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 3 * 4 * 4 * 2 and any("b[1, 2)" in line for line in listed)
    with pytest.raises(SystemExit) as exit_info:
        dispatch_evidence.main([*base, "--seq-cuts", "8192,1024"])
    assert exit_info.value.code == 2 and "strictly increasing" in capsys.readouterr().err

