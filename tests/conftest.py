"""Test-wide settings: signing keys live in a throwaway folder, never in ~/.kernelgate."""

from __future__ import annotations

import os

import pytest

from tests.prefect_servers import _temporary_prefect_servers_stop_with_the_session  # noqa: F401

# The suite already runs a process per core (`make test`: two workers on the 2-core host),
# so an interpreted candidate's cases stay in the test's own process rather than in a
# second one (evaluation.case_processes); tests/test_evaluation_case_processes.py turns
# the second process on where it tests it.
os.environ.setdefault("KERNELGATE_CASE_PROCESSES", "1")


@pytest.fixture(scope="session", autouse=True)
def _key_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    previous = os.environ.get("KERNELGATE_KEY_DIR")
    os.environ["KERNELGATE_KEY_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("KERNELGATE_KEY_DIR", None)
    else:
        os.environ["KERNELGATE_KEY_DIR"] = previous


@pytest.fixture(autouse=True)
def _kernelgate_home(tmp_path_factory, monkeypatch):
    """Each test's own kernelgate home: the heads its audits remember (never ~/.kernelgate)."""
    monkeypatch.setenv("KERNELGATE_HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture
def signing(_key_folder):
    """The pipeline's signer and trust, as a rollout in this test session would have."""
    from lineage.signing import keys
    from lineage.signing.attestations import Signing

    return Signing(signer=keys.load_signer(keys.ensure_pipeline_key(_key_folder)),
                   trust=keys.folder_trust(_key_folder))


def pytest_collection_modifyitems(config, items):
    """The slowest work first (``tests.scheduling``: the order ``make test`` hands out)."""
    from tests.scheduling import order

    order(items)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown when xdist is absent
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with test_attacks.py's attacks in two parts (``tests.scheduling``)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from tests.scheduling import SplitLoadFileScheduling

    return SplitLoadFileScheduling(config, log)
