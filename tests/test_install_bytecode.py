"""`make venv` installs the stack with its bytecode (Makefile: --compile-bytecode): where
PYTHONDONTWRITEBYTECODE is set, a venv without it compiles every imported source again in
every process (the CPU suite, rollouts and servers ran ~2x slower to start)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["prefect", "mlflow", "jax", "great_expectations", "flows"])
def test_the_makefile_venv_carries_bytecode_for_the_stack(package):
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip(f"not the Makefile's venv ({sys.prefix})")
    module = importlib.import_module(package)
    cached = Path(importlib.util.cache_from_source(module.__file__))
    assert cached.exists(), (f"{package} has no bytecode at {cached}: the venv was installed "
                             "without --compile-bytecode (Makefile, $(STAMP))")
