"""What a build's fingerprint and a version's code digest cover: every file
that can change a kernel's output, speed or dispatch, and nothing of ``kernels/tools``
(benchmarks, autotuner, their results and notes).

Both digests are taken over a temporary copy of the packages; the real files are never
edited."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kernels.build import combined_digest, source_digests
from lineage.model import SNAPSHOT_PACKAGES, code_digest, snapshot_digests

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the snapshot's packages (``tmp/checkout/{kernels,evaluation,lineage}``),
    under a parent folder named ``tools`` so that a test also catches a filter that
    looks at absolute path parts."""
    root = tmp_path / "tools" / "checkout"
    for package in SNAPSHOT_PACKAGES:
        shutil.copytree(ROOT / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _digests(root: Path) -> tuple[str, str]:
    return combined_digest(source_digests(root / "kernels")), code_digest(snapshot_digests(root))


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_the_tools_exist_where_the_exclusion_expects_them():
    tools = ROOT / "kernels" / "tools"
    assert {"bench.py", "bench_serving.py", "autotune.py", "NOTES-gpu.md"} <= {
        p.name for p in tools.iterdir()}
    assert (tools / "bench_results").is_dir()
    assert not (ROOT / "kernels" / "bench.py").exists()


@pytest.mark.parametrize("edit", ["tools/bench.py", "tools/autotune.py", "tools/bench_serving.py",
                                  "tools/NOTES-gpu.md", "tools/bench_results/new.json",
                                  "tools/new_tool.py"])
def test_a_tools_change_moves_neither_digest(checkout, edit):
    before = _digests(checkout)
    path = checkout / "kernels" / edit
    if path.exists():
        _append(path, "\n# reformatted\n")
    else:
        path.write_text('{"a": 1}\n' if path.suffix == ".json" else "X = 1\n")
    assert _digests(checkout) == before
    assert not any(f.startswith("tools/") for f in source_digests(checkout / "kernels"))
    assert not any("/tools/" in f for f in snapshot_digests(checkout))


@pytest.mark.parametrize("edit", ["xla.py", "pallas_gpu.py", "api.py", "gpu_table.json"])
def test_a_kernel_change_moves_both_digests(checkout, edit):
    source_before, code_before = _digests(checkout)
    path = checkout / "kernels" / edit
    if path.suffix == ".json":
        path.write_text(path.read_text().rstrip() + " \n")
    else:
        _append(path, "\n# edited\n")
    source_after, code_after = _digests(checkout)
    assert source_after != source_before
    assert code_after != code_before


def test_a_new_kernel_module_moves_both_digests(checkout):
    before = _digests(checkout)
    (checkout / "kernels" / "my_kernel.py").write_text('"""A new kernel."""\n')
    source_after, code_after = _digests(checkout)
    assert source_after != before[0] and code_after != before[1]
    assert "my_kernel.py" in source_digests(checkout / "kernels")
