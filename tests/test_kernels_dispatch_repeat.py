"""kernels.tools.dispatch_repeat: how far one measurement's dispatch choices carry."""

from __future__ import annotations

import json

import pytest

from kernels.dispatch_pieces import EvidencePiece
from kernels.dispatch_policy import Rule
from kernels.tools import dispatch_repeat
from tests.test_kernels_dispatch_policy import MEASURED, make_evidence


def _as_piece(evidence, **fields) -> EvidencePiece:
    data = {"label": "whole", "space": evidence.space, "device": evidence.device,
            "backend": evidence.backend, "method": evidence.method,
            "software": {"jax": "0.0-stand-in"}, "buckets": evidence.buckets}
    return EvidencePiece(**{**data, **fields})


FIRST = _as_piece(make_evidence(MEASURED))
REPEAT = _as_piece(make_evidence({**MEASURED, (32, 64): {"xla": 1.0e-5, "naive": 2.0e-5}}),
                   method="stand-in timings, fewer repeats")
"""The repeat flips one bucket: naive was 2.5x faster than xla there, now xla is 2x."""


def test_a_flipped_bucket_is_named_and_its_carried_regret_is_the_other_sides_ratio():
    report = dispatch_repeat.compare([FIRST], [REPEAT], ("xla", "naive"), Rule())
    assert report.common_buckets == 3  # the bucket both kernels refuse has no choice
    assert report.same_choice == 2
    (name, (was, now)), = report.changed.items()
    assert (was, now) == ("naive", "xla") and "q[32" in name
    # naive timed in the repeat: 2e-5 over xla's 1e-5; xla timed in the first: 5e-5 / 2e-5
    assert report.first_carried_into_second.largest == pytest.approx(2.0)
    assert report.second_carried_into_first.largest == pytest.approx(2.5)
    assert report.first_carried_into_second.over_5_percent == 1
    assert report.kernel_ratio_second_over_first["xla"]["min"] == pytest.approx(0.2)
    assert report.differs == {"method": ("stand-in timings",
                                         "stand-in timings, fewer repeats")}


def test_a_measurement_repeated_exactly_carries_every_choice_at_no_regret():
    report = dispatch_repeat.compare([FIRST], [FIRST], ("xla", "naive"), Rule())
    assert report.same_choice == report.common_buckets == 3 and not report.changed
    assert report.first_carried_into_second.largest == 1.0 and not report.differs


def test_the_command_prints_the_table_writes_json_and_refuses_bad_input(tmp_path, capsys):
    (tmp_path / "a.json").write_text(FIRST.model_dump_json())
    (tmp_path / "b.json").write_text(REPEAT.model_dump_json())
    assert dispatch_repeat.main(["--first", str(tmp_path / "a.json"), "--second",
                                 str(tmp_path / "b.json"), "--json",
                                 str(tmp_path / "r.json")]) == 0
    assert "3 buckets measured by both; the same choice in 2" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["same_choice"] == 2
    other = _as_piece(make_evidence({(32, 16): {"xla": 1e-5}}), device="another card")
    (tmp_path / "c.json").write_text(other.model_dump_json())
    assert dispatch_repeat.main(["--first", str(tmp_path / "a.json"), str(tmp_path / "c.json"),
                                 "--second", str(tmp_path / "b.json")]) == 2
    assert "not one measurement" in capsys.readouterr().err


def test_long_buckets_are_summarised_apart_and_only_where_the_bucket_starts_long():
    # the stand-in grid cuts q_len at 32 and leaves kv_len whole (from 1)
    report = dispatch_repeat.compare([FIRST], [REPEAT], ("xla", "naive"), Rule(), long_from=32)
    assert report.long_buckets == 0 and report.long_first_carried_into_second is None
    report = dispatch_repeat.compare([FIRST], [REPEAT], ("xla", "naive"), Rule(), long_from=1)
    assert report.long_buckets == 3
    assert report.long_first_carried_into_second.largest == pytest.approx(2.0)


@pytest.mark.parametrize("content", ["not json", '{"version": 1, "rules": []}', "[]"])
def test_a_file_that_is_not_a_piece_is_named(tmp_path, capsys, content):
    (tmp_path / "a.json").write_text(FIRST.model_dump_json())
    (tmp_path / "policy.json").write_text(content)
    assert dispatch_repeat.main(["--first", str(tmp_path / "a.json"), "--second",
                                 str(tmp_path / "policy.json")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'policy.json'}: not a dispatch evidence piece" in err, err
    assert "errors.pydantic.dev" not in err


def test_a_report_path_that_cannot_be_written_is_named_not_a_traceback(tmp_path, capsys):
    (tmp_path / "a.json").write_text(FIRST.model_dump_json())
    (tmp_path / "b.json").write_text(REPEAT.model_dump_json())
    assert dispatch_repeat.main(["--first", str(tmp_path / "a.json"), "--second",
                                 str(tmp_path / "b.json"), "--json", str(tmp_path)]) == 2
    assert f"dispatch_repeat: cannot write {tmp_path}" in capsys.readouterr().err
