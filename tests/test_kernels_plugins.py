"""Kernels registered from outside ``kernels/`` through ``KERNELGATE_KERNELS`` (the GPU
canary calibration's stage 2): the slowed variant of a kernel (``tests/slowed_kernel.py``)
is a real kernel with its own registry name and build fingerprint, selectable by
``kernelgate rollout --implementation <name>`` without editing code."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import kernels
from kernels import dispatch, registry
from kernels.build import build as build_kernel
from kernels.reference import attention_reference, relative_error
from tests import slowed_kernel

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the variable's grammar


def test_plugins_are_read_from_the_variable():
    entries = registry.plugins_from_env(
        {registry.PLUGINS_ENV: " a_one=tests.x:One, b_two=pkg.mod:factory "})
    assert entries == {"a_one": "tests.x:One", "b_two": "pkg.mod:factory"}
    assert registry.plugins_from_env({}) == {}
    assert registry.plugins_from_env({registry.PLUGINS_ENV: ""}) == {}


@pytest.mark.parametrize("value, words", [
    ("tests.x:One", "name=module:attribute"),
    ("one=tests.x", "name=module:attribute"),
    ("one=:One", "name=module:attribute"),
    ("xla=tests.x:One", "built-in"),
    ("auto=tests.x:One", "selection mode"),
    ("one=tests.x:One,one=tests.y:Two", "twice"),
])
def test_a_bad_plugin_entry_is_refused_naming_the_constraint(value, words):
    with pytest.raises(ValueError, match=words) as err:
        registry.plugins_from_env({registry.PLUGINS_ENV: value})
    assert registry.PLUGINS_ENV in str(err.value)


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu",
                               **env})


def test_a_plugin_kernel_is_selectable_by_name_in_a_fresh_process():
    name = "slowed_xla_x3"
    code = ("import json, kernels; from flows.kernel_choice import rollout_kernel; "
            f"k = kernels.IMPLEMENTATIONS[{name!r}]; "
            f"print(json.dumps([sorted(kernels.IMPLEMENTATIONS), rollout_kernel({name!r}, "
            "'cpu', None)[0], k.repeats, k.base]))")
    done = _python(code, **{registry.PLUGINS_ENV: f"{name}=tests.slowed_kernel:{name}"})
    assert done.returncode == 0, done.stderr
    names, picked, repeats, base = json.loads(done.stdout.strip().splitlines()[-1])
    assert name in names and picked == name and repeats == 3 and base == "xla"
    # without the variable it is unknown, and the error lists the registry
    done = _python(f"import kernels; kernels.native_flash_kernel({name!r}, 'cpu')",
                   **{registry.PLUGINS_ENV: ""})
    assert done.returncode != 0 and "unknown implementation" in done.stderr


def test_the_cli_accepts_a_plugin_name_before_importing_the_kernels():
    """`kernelgate rollout --implementation <plugin>` is checked by ``flows.cli_args`` before
    JAX is imported (the registry imports no JAX and loads no kernel to list its names):
    the plugin names of the variable count there too. On the H200 (2026-12-01) the slowed rollout of stage 2
    was refused as an unknown implementation while the same name worked in
    ``tools/canary_runs.py``."""
    name = "slowed_xla_x3"
    code = ("import sys; from flows import cli_args; "
            f"print(cli_args.check_implementation({name!r})); "
            "assert 'jax' not in sys.modules and 'kernels.xla' not in sys.modules")
    done = _python(code, **{registry.PLUGINS_ENV: f"{name}=tests.slowed_kernel:{name}"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == name
    done = _python(code, **{registry.PLUGINS_ENV: ""})
    assert done.returncode != 0 and "unknown implementation 'slowed_xla_x3'" in done.stderr



@pytest.mark.parametrize("typed, meant", [("pallas_tpuu", "pallas_tpu"), ("dispach", "dispatch"),
                                           ("flash9000", None)])
def test_a_misspelt_implementation_is_refused_with_the_name_it_is_nearest(typed, meant):
    import typer

    from flows import cli_args

    with pytest.raises(typer.BadParameter, match=f"unknown implementation '{typed}'") as refused:
        cli_args.check_implementation(typed)
    said = str(refused.value)
    assert (f"did you mean {meant!r}?" in said) if meant else ("did you mean" not in said), said
    assert "'auto', 'native' or 'dispatch'" in said


def test_the_cli_check_reads_the_registry_itself():
    """``flows.cli_args`` imports the registry (no JAX) instead of a copy of its names or
    its grammar: the same names, plugins included."""
    from flows import cli_args

    assert cli_args.kernel_names() == sorted(kernels.IMPLEMENTATIONS)


def test_the_plugin_grammar_and_the_registry_are_read_without_jax():
    """``kernels/plugin_names.py`` imports only the standard library, and the CLI's check
    (which imports the registry) leaves JAX and numpy unimported — also after refusing a
    bad variable, which exits 2 with the registry's message."""
    source = ROOT / "kernels" / "plugin_names.py"
    tree = ast.parse(source.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    heavy = "[m for m in ('jax', 'numpy') if m in sys.modules]"
    code = ("import sys; from flows import cli_args; "
            f"print(cli_args.check_implementation('slowed_xla_x3'), {heavy})")
    done = _python(code, **{registry.PLUGINS_ENV: "slowed_xla_x3=tests.slowed_kernel:x"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["slowed_xla_x3", "[]"]
    code = ("import sys\nfrom flows.cli import app\ntry:\n    app(args=sys.argv[1:])\n"
            f"except SystemExit as e:\n    print('exit', e.code, {heavy})\n")
    done = subprocess.run([sys.executable, "-c", code, "rollout", "--implementation", "xla"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT),
                               registry.PLUGINS_ENV: "one = tests.x:One"})
    assert done.stdout.strip().splitlines()[-1] == "exit 2 []", (done.stdout, done.stderr)
    assert "KERNELGATE_KERNELS: 'one = tests.x:One' is not name=module:attribute" in done.stderr


# ------------------------------------------------------------------ the slowed kernel


@pytest.fixture
def slowed_x3():
    dispatch.get_attention_fn.cache_clear()
    with kernels.registered(slowed_kernel.slowed_xla_x3) as kernel:
        yield kernel
    dispatch.get_attention_fn.cache_clear()


def test_slowed_names_are_parsed_and_bad_ones_refused():
    cls = slowed_kernel.slowed_pallas_gpu_x16
    assert cls.name == "slowed_pallas_gpu_x16" and cls.repeats == 16
    assert cls.base == "pallas_gpu" and cls.native_platforms == ("gpu",)
    assert cls.capability == kernels.IMPLEMENTATIONS["pallas_gpu"].capability
    assert not cls.tuned and not cls.ours
    with pytest.raises(AttributeError, match="repeats"):
        slowed_kernel.slowed_xla_x1  # noqa: B018
    with pytest.raises(AttributeError, match="no kernel"):
        slowed_kernel.slowed_nosuch_x4  # noqa: B018
    with pytest.raises(AttributeError):
        slowed_kernel.something_else  # noqa: B018


def test_the_slowed_kernel_computes_attention(slowed_x3):
    rng = np.random.default_rng(np.random.SeedSequence().entropy)
    q, k, v = (rng.standard_normal((2, 70, 4, 32)).astype(np.float32) for _ in range(3))
    kv_lengths = np.array([70, 41], np.int32)
    fn = kernels.get_attention_fn(slowed_x3.name)
    out = np.asarray(fn(q, k, v, causal=True, kv_lengths=kv_lengths))
    ref = attention_reference(q, k, v, causal=True, kv_lengths=kv_lengths)
    assert relative_error(out, ref) < 1e-5
    assert fn.resolutions[next(iter(fn.resolutions))].name == slowed_x3.name


def _dots(implementation: str) -> int:
    shape = kernels.AttentionShape(batch=1, q_len=64, kv_len=64, num_heads=2,
                                   num_kv_heads=2, head_dim=32, dtype="float32")
    q, k, v = shape.structs()
    fn = kernels.get_attention_fn(implementation)
    text = jax.jit(lambda q, k, v: fn(q, k, v)).lower(q, k, v).as_text()
    return text.count("dot_general")


def test_the_slowed_kernel_repeats_its_base_and_is_built_as_another_kernel(slowed_x3, tmp_path):
    assert _dots(slowed_x3.name) == 3 * _dots("xla") > 0
    shape = dict(batch=1, q_len=64, kv_len=64, num_heads=2, num_kv_heads=2, head_dim=32,
                 dtype="float32")
    slow = build_kernel(slowed_x3.name, None, shape, platforms=("cpu",),
                         output_dir=tmp_path / "slow")
    base = build_kernel("xla", None, shape, platforms=("cpu",), output_dir=tmp_path / "xla")
    assert slow.resolution.name == slowed_x3.name and slow.resolution.native
    assert slow.artifact("cpu").sha256 != base.artifact("cpu").sha256
