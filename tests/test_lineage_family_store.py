"""``FamilyStore`` against a real MLflow SQLite store: its methods read and write exactly
what the functions they stand for read and write."""

from __future__ import annotations

import pytest

from gates.decision import decide
from gates.thresholds import load_thresholds
from lineage.aliases import registered_model, registry
from lineage.family_store import FamilyStore
from lineage.log import family_log, log_writer
from lineage.records.records import load_decision
from lineage.signing.sources import StoreSource
from lineage.store import tracking as tr
from tests.conftest_lineage import (
    evaluation_report,
    passing_metrics,
    promotable_chain,
    slug,
    thresholds_yaml,
)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    return tr.local_tracking(tmp_path_factory.mktemp("mlflow"))


@pytest.fixture
def family(request):
    return slug(request.node.name)


def _thresholds(tmp_path):
    path = tmp_path / "thresholds.yaml"
    path.write_text(thresholds_yaml())
    return path


def test_reads_are_the_functions_reads(tracking, family, tmp_path, signing):
    store = FamilyStore(tracking, family, signing)
    chain = promotable_chain(tracking, family, _thresholds(tmp_path), signing=signing)
    change = store.promote(chain.version, decision_run_id=chain.decision_run_id,
                           expected_previous=store.production_version())
    assert (change.action, change.version) == ("promote", chain.version)

    assert store.aliases() == registered_model.aliases(tracking, family) == {
        "production": chain.version}
    assert store.production_version() == chain.version
    assert store.alias_version("production") == registered_model.alias_version(
        tracking, family, "production")
    assert store.alias_version("canary") is None
    assert store.version_exists(chain.version)
    assert not store.version_exists("999")
    assert store.version_tags(chain.version) == registered_model.version_tags(
        tracking, family, chain.version)
    assert store.approvers(chain.version) == registered_model.approvers(
        tracking, family, chain.version)
    assert store.production_history() == registered_model.production_history(
        tracking, family, signing.trust)
    moves, problems = store.alias_history()
    got, found = registered_model.store_alias_history(tracking, family, signing.trust)
    assert ([m.envelope_sha256 for m in moves], problems) == ([m.envelope_sha256 for m in got], found)
    assert problems == [] and len(moves) == 1

    log = store.log()
    expected = family_log.read(StoreSource(tracking, family, signing.trust))
    assert log.length == expected.length > 0
    assert log.problems == expected.problems == []
    assert {s: a.envelope_sha256 for s, a in log.entries.items()} == {
        s: a.envelope_sha256 for s, a in expected.entries.items()}
    assert store.require_intact().length == log.length
    assert store.source().family == family and store.trust is signing.trust


def test_writes_land_where_the_functions_put_them(tracking, family, tmp_path, signing):
    store = FamilyStore(tracking, family, signing)
    path = _thresholds(tmp_path)
    chain = promotable_chain(tracking, family, path, signing=signing)
    decision = decide(evaluation_report(passing_metrics()), load_thresholds(path),
                      chain.registration)
    run_id = store.log_decision(decision, build_run_id=chain.build_run_id,
                                evaluation_run_id=chain.evaluation_run_id,
                                version=chain.version)
    read = load_decision(store.source(), run_id)
    assert (read.decision, read.version, read.build_run_id) == (
        decision, chain.version, chain.build_run_id)

    before = store.log().length
    entry = store.append(run_id, "outcome", {"family": family, "result": "built"})
    after = store.log()
    assert after.length == before + 1
    assert after.entries[after.length].envelope_sha256 == entry.envelope_sha256
    assert log_writer.require_intact(tracking, family, signing).length == after.length

    store.assign_shadow(chain.version)
    assert store.alias_version("shadow") == chain.version
    assert store.reject(chain.version, "not today")
    assert store.alias_version("shadow") is None
    assert registry.reconcile(tracking, family, signing) == store.reconcile() == []


def test_of_takes_the_record_s_store_family_and_signing(tracking, signing):
    class Record:
        pass

    record = Record()
    record.tracking, record.family, record.signing = tracking, "fam", signing
    assert FamilyStore.of(record) == FamilyStore(tracking, "fam", signing)
    with pytest.raises(AttributeError):
        FamilyStore.of(record).family = "other"  # frozen
