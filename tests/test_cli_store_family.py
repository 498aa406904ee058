"""Which family a store command reads when ``--family`` is not given."""

from __future__ import annotations

import pytest
import typer

import kernels
from flows import cli_store


@pytest.fixture
def store_families(monkeypatch):
    """Stand in for the store's experiment list (``cli_store.families``)."""
    def use(names: list[str]) -> None:
        monkeypatch.setattr(cli_store, "families", lambda tracking: sorted(names))
    return use


def test_a_store_of_one_family_is_read_without_naming_it(store_families) -> None:
    native = kernels.native_flash_kernel("auto", kernels.default_backend())
    other = "pallas_mosaic_gpu" if native != "pallas_mosaic_gpu" else "xla"
    store_families([other])
    assert cli_store.existing_family(None, None) == other


def test_several_families_default_to_the_native_kernel(store_families) -> None:
    native = kernels.native_flash_kernel("auto", kernels.default_backend())
    store_families([native, "pallas_mosaic_gpu", "naive"])
    assert cli_store.existing_family(None, None) == native


def test_an_unknown_family_is_refused_naming_the_known_ones(store_families) -> None:
    store_families(["pallas_mosaic_gpu", "naive"])
    with pytest.raises(typer.BadParameter, match=r"no family 'xla'.*pallas_mosaic_gpu"):
        cli_store.existing_family(None, "xla")


def test_an_audit_of_a_store_that_is_not_there_is_refused_before_anything_is_said(tmp_path):
    """Exit 2 naming ``--store-dir`` and the folder; the key-trust line, which would
    suggest the audit had begun, is not printed; nothing is created."""
    from typer.testing import CliRunner

    from flows.cli import app

    missing = tmp_path / "no-store"
    result = CliRunner().invoke(app, ["audit", "--store-dir", str(missing)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "--store-dir" in text and f"no MLflow store at {missing}" in text, text
    assert "trusting" not in text, text
    assert not missing.exists()
