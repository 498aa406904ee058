"""``auto`` and ``native``: what each means on each backend, and the CLI says it."""

from __future__ import annotations

import pytest

import kernels
from kernels.api import AUTO_ORDER, NATIVE_FLASH


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_native_is_what_attention_auto_runs_first(backend):
    assert kernels.native_flash_kernel("native", backend) == AUTO_ORDER[backend][0]
    assert kernels.native_flash_kernel("auto", backend) == NATIVE_FLASH[backend]


def test_auto_on_a_cpu_says_it_interprets_and_names_the_native_kernel():
    why = kernels.why_picked("auto", "cpu")
    assert NATIVE_FLASH["cpu"] in why and "interpreted" in why
    assert f"native kernel ({AUTO_ORDER['cpu'][0]})" in why
    assert "as asked" in kernels.why_picked("xla", "cpu")
    assert "interpreted" not in kernels.why_picked("auto", "gpu")
    with pytest.raises(ValueError, match="unknown implementation"):
        kernels.why_picked("fast", "cpu")
