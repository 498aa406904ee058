"""``tools.longdoc_same_kernel``: one program where ``auto`` serves the named kernel, a
difference in the program detected, and bad input refused before anything compiles."""

from __future__ import annotations

import json

import pytest

from tools import longdoc_same_kernel as same

HLO = """HloModule jit_encode_a, entry_computation_layout={(f32[2]{0})->f32[2]{0}}

ENTRY main {
  p = f32[2]{0} parameter(0), metadata={op_name="jit(encode)/a" source_file="x.py" source_line=3}
  ROOT e = f32[2]{0} exponential(p), metadata={op_name="jit(encode)/exp" source_line=9}
}
"""


FRAMES = """
FileNames
1 "/repo/evaluation/longdoc/encoder.py"

FunctionNames
1 "_layers"

FileLocations
1 {file_name_id=1 function_name_id=1 line=117 end_line=117 column=15 end_column=64}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
"""


def test_two_call_paths_of_one_program_normalize_to_one_text_and_another_op_does_not():
    renamed = HLO.replace("jit_encode_a", "jit_encode_b").replace('source_line=9', 'source_line=12')
    assert same.normalized_hlo(renamed) == same.normalized_hlo(HLO)
    first, rest = HLO.split("\n", 1)
    assert same.normalized_hlo(f"{first}\n{FRAMES}{rest}") == same.normalized_hlo(HLO)
    changed = HLO.replace("exponential(p)", "tanh(p)")
    assert same.normalized_hlo(changed) != same.normalized_hlo(HLO)
    assert "metadata" not in same.normalized_hlo(HLO)


def test_auto_serving_the_named_kernel_compiles_the_same_program(tmp_path, capsys):
    out = tmp_path / "same.json"
    assert same.main(["--workload", "longdoc-cpu-small", "--kernel", "xla", "--rows", "2",
                      "--bucket", "64", "--rounds", "8", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["auto_resolved"] == ["xla"] and result["tokens"] == 45  # ceil(0.7 * 64)
    assert result["hlo_lines_differing"] == 0 and result["hlo_lines"] > 20
    assert len(set(result["hlo_sha256"].values())) == 1
    assert len(result["auto_s"]) == len(result["kernel_s"]) == 8
    assert "the same program" in capsys.readouterr().out


@pytest.fixture
def persistent_cache(tmp_path):
    """JAX's persistent compilation cache on for the test (as CI's runs have it), then off."""
    import jax

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = [getattr(jax.config, n) for n in names]
    for name, value in zip(names, (str(tmp_path / "cache"), 0, -1), strict=True):
        jax.config.update(name, value)
    yield
    for name, value in zip(names, before, strict=True):
        jax.config.update(name, value)


def test_the_second_program_loaded_from_the_persistent_cache_is_still_the_same(
        persistent_cache, tmp_path):
    """One program compiled, the other a cache hit (its text carries the first call's
    stack frames, or none): still the same program."""
    out = tmp_path / "same.json"
    assert same.main(["--workload", "longdoc-cpu-small", "--kernel", "xla", "--rows", "2",
                      "--bucket", "32", "--rounds", "8", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["hlo_lines_differing"] == 0


def test_a_kernel_auto_does_not_serve_there_is_refused_by_name(capsys):
    assert same.main(["--workload", "longdoc-cpu-small", "--kernel", "naive", "--bucket", "32",
                      "--rounds", "8"]) == 2
    assert "auto resolves to ['xla'] at 1x32, not 'naive'" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--fill", "0"], "--fill must lie in (0, 1], got 0.0"),
    (["--rounds", "7"], "--rounds must be at least 8"),
    (["--rows", "0"], "--rows and --bucket must be at least 1"),
])
def test_bad_arguments_are_usage_errors_naming_the_constraint(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        same.main(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
