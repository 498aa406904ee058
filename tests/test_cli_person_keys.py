"""The commands a person runs with a key answer a wrong key, a mistyped key id or profile,
and a missing Prefect server with one line naming the constraint (exit 2), and write
nothing; the audit command a rollout prints names the key folder it was signed with."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from lineage.rollout.rollout import _commands
from lineage.signing import keys
from lineage.store.tracking import local_tracking


@pytest.fixture
def run(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELGATE_KEY_DIR", str(tmp_path / "keys"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)

    def invoke(*args: str):
        result = CliRunner().invoke(app, list(args))
        return result.exit_code, " ".join(result.output.split())
    return invoke


def test_a_public_key_given_for_a_private_one_is_named(run, tmp_path):
    keys.create_key(tmp_path / "alice.pem")
    code, out = run("keys", "entry", "--key", str(tmp_path / "alice.pub.json"), "--family", "xla")
    assert code == 2 and "give your private key" in out and "Traceback" not in out, out


def test_the_pipeline_key_is_refused_as_a_persons(run, tmp_path):
    pipeline = keys.ensure_pipeline_key(tmp_path / "keys")
    code, out = run("keys", "entry", "--key", str(pipeline), "--family", "xla")
    assert code == 2 and "is a pipeline key" in out, out
    keys.create_key(tmp_path / "alice.pem")
    code, out = run("keys", "entry", "--key", str(tmp_path / "alice.pem"), "--family", "xla")
    assert code == 0 and '"name": "alice"' in out, out


def test_a_mistyped_key_id_is_no_revocation(run, tmp_path):
    code, out = run("keys", "revoke", "deadbeef", "--key-dir", str(tmp_path / "keys"))
    assert code == 2 and "is not a key id: 64 hex digits" in out, out
    assert not (tmp_path / "keys" / keys.REVOKED_FILE).exists()


def test_an_unknown_test_set_profile_is_refused_before_anything_is_built(run, tmp_path):
    code, out = run("testset", "--profile", "bogus", "--out", str(tmp_path / "ts"))
    assert code == 2 and "'bogus': one of ['ci', 'gpu', 'minimal']" in out, out
    assert not (tmp_path / "ts").exists()


def test_an_approval_without_a_prefect_server_says_which_setting_is_missing(run, tmp_path):
    keys.create_key(tmp_path / "alice.pem")
    code, out = run("approve", "0f3c-run", "--key", str(tmp_path / "alice.pem"),
                    "--comment", "ship")
    assert code == 2 and "PREFECT_API_URL is not set" in out, out


def test_an_approval_with_a_revoked_key_is_refused_before_the_server_is_asked(run, tmp_path,
                                                                              monkeypatch):
    """A key revoked in the key folder approves nothing: ``approve`` says so with the
    rollout's own wording (exit 2) before it looks for a Prefect server or resumes anything."""
    from lineage.signing.approvals import revocations, revoked_key

    folder = tmp_path / "keys"
    keys.ensure_pipeline_key(folder)
    alice = keys.create_key(tmp_path / "alice.pem")
    keys.revoke(alice.keyid, folder, at=None)
    resumed = []
    monkeypatch.setattr("prefect.flow_runs.resume_flow_run", lambda *a, **k: resumed.append(a))
    code, out = run("approve", "0f3c-run", "--key", str(tmp_path / "alice.pem"),
                    "--comment", "ship")
    wording = revoked_key([alice.keyid], revocations(keys.folder_trust(folder)))
    assert wording is not None
    assert code == 2 and " ".join(wording.split()) in out, out
    assert "PREFECT_API_URL" not in out and not resumed, out


def test_the_printed_audit_command_names_a_key_folder_other_than_the_default(tmp_path,
                                                                              monkeypatch):
    monkeypatch.delenv("KERNELGATE_KEY_DIR", raising=False)
    tracking = local_tracking(tmp_path / "store")
    _, own = _commands(tracking, "xla", "1", tmp_path / "my-keys")
    assert own.endswith(f"--store-dir {tmp_path / 'store'} --key-dir {tmp_path / 'my-keys'}")
    _, default = _commands(tracking, "xla", "1", keys.default_key_dir())
    assert "--key-dir" not in default


def test_listing_an_empty_key_folder_says_so(tmp_path):
    """An empty (or missing) key folder is named, with how keys come to be there."""
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["keys", "list", "--key-dir", str(tmp_path / "none")])
    assert result.exit_code == 0, result.output
    assert f"no keys in {tmp_path / 'none'}" in result.output


def _key_dir_help(*path: str) -> str | None:
    """The ``--key-dir`` help of the command at ``path`` (None: it has no such option)."""
    import typer.main

    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    option = next((p for p in command.params if "--key-dir" in p.opts), None)
    return None if option is None else option.help


def test_every_command_that_reads_the_key_folder_takes_key_dir_with_one_help():
    """rollback, approve and keys entry read the pipeline's key folder as rollout, audit,
    timeline and the other keys commands do: the same option, the same words (default
    ~/.kernelgate/keys or KERNELGATE_KEY_DIR)."""
    reference = _key_dir_help("rollout")
    assert reference and "KERNELGATE_KEY_DIR" in reference
    commands = [("audit",), ("timeline",), ("approve-loosening",), ("reanchor",),
                ("keys", "create"), ("keys", "list"), ("keys", "rotate"), ("keys", "revoke"),
                ("rollback",), ("approve",), ("keys", "entry")]
    assert {path: _key_dir_help(*path) for path in commands} == dict.fromkeys(commands,
                                                                              reference)


def test_keys_entry_and_approve_read_the_key_folder_given(run, tmp_path):
    """--key-dir names the folder whose pipeline key is refused as a person's and whose
    revocations are refused; the environment's folder (KERNELGATE_KEY_DIR) is another."""
    other = tmp_path / "other-keys"
    pipeline = keys.ensure_pipeline_key(other)
    code, out = run("keys", "entry", "--key", str(pipeline), "--family", "xla",
                    "--key-dir", str(other))
    assert code == 2 and "is a pipeline key" in out, out
    alice = keys.create_key(tmp_path / "alice.pem")
    keys.revoke(alice.keyid, other, at=None)
    code, out = run("approve", "0f3c-run", "--key", str(tmp_path / "alice.pem"),
                    "--comment", "ship", "--key-dir", str(other))
    assert code == 2 and "a revoked key approves nothing" in out, out
    code, out = run("approve", "0f3c-run", "--key", str(tmp_path / "alice.pem"),
                    "--comment", "ship")  # the environment's folder revokes nothing
    assert code == 2 and "PREFECT_API_URL is not set" in out, out


def test_rollback_signs_with_the_key_folder_given(run, tmp_path, monkeypatch):
    """``rollback --key-dir`` hands the folder to the manual-rollback flow, which signs
    the move with that folder's pipeline key (none given: the flow's default)."""
    from types import SimpleNamespace

    import flows.rollback

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    local_tracking(store).client().create_experiment("kernelgate-xla")
    asked = []

    def manual_rollback(**kwargs):
        asked.append(kwargs)
        return SimpleNamespace(previous_version="2", version="1")

    checked = []
    monkeypatch.setattr(flows.rollback, "manual_rollback", manual_rollback)
    monkeypatch.setattr(flows.rollback, "check_manual_rollback",
                        lambda *args: checked.append(args))
    base = ("rollback", "--reason", "paging storm", "--requested-by", "rm", "--family", "xla",
            "--store-dir", str(store))
    code, out = run(*base, "--key-dir", str(tmp_path / "other-keys"))
    assert code == 0 and "v2 -> v1" in out, out
    code, out = run(*base)
    assert code == 0, out
    assert [a["key_dir"] for a in asked] == [str(tmp_path / "other-keys"), None]
    assert [c[3] for c in checked] == [str(tmp_path / "other-keys"), None]


def test_a_rollback_the_registry_refuses_is_refused_in_a_line_before_its_flow_starts(
        run, tmp_path, monkeypatch):
    """``rollback --to 99`` on a store whose signed history never promoted v99: exit 2 and
    the registry's reason, from the check asked before the flow (whose engine would log
    the exception with a traceback first); the flow never runs."""
    import flows.rollback
    from lineage.aliases.registry import PromotionRefused

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    local_tracking(store).client().create_experiment("kernelgate-xla")

    def refuse(to_version, family, store_dir, key_dir=None):
        raise PromotionRefused(f"kernelgate-{family} v{to_version} is not an earlier "
                               "production version (signed history: ['1'])")

    def flow_started(**_):
        raise AssertionError("the flow ran although the check refused")

    monkeypatch.setattr(flows.rollback, "check_manual_rollback", refuse)
    monkeypatch.setattr(flows.rollback, "manual_rollback", flow_started)
    code, out = run("rollback", "--to", "99", "--reason", "test", "--requested-by", "rm",
                    "--family", "xla", "--store-dir", str(store))
    assert code == 2 and "refused: kernelgate-xla v99 is not an earlier production" in out, out
    assert "Traceback" not in out


def test_keys_create_makes_the_role_asked_for_and_says_which(run, tmp_path):
    """The role is an option (default: an approver's key), never read from the name;
    the first line of the output names the role made."""
    folder, no_store = tmp_path / "keys", ("--store-dir", str(tmp_path / "no-store"))
    code, out = run("keys", "create", "--name", "alice", *no_store)
    assert code == 0 and "an approver key" in out and "pipeline key" not in out.split(":")[0], out
    assert (folder / keys.APPROVER_DIR / "alice.pem").exists()
    assert not (folder / "pipeline.pem").exists()
    code, out = run("keys", "create", "--role", "pipeline", *no_store)
    assert code == 0 and "the pipeline key" in out, out
    assert keys.pipeline_public_files(folder) == [folder / "pipeline.pub.json"]


@pytest.mark.parametrize(("args", "said"), [
    (["--name", "pipeline2"], "--role pipeline"),
    (["--name", "Pipeline"], "--role pipeline"),
    ([], "an approver's key needs --name"),
    (["--role", "pipeline", "--name", "pipeline2"], "always named 'pipeline'"),
    (["--role", "pipeline", "--family", "xla"], "--family names an approver's family"),
    (["--role", "owner", "--name", "alice"], "'owner': one of ['approver', 'pipeline']"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_keys_create_refuses_a_role_the_name_contradicts_and_writes_nothing(run, tmp_path,
                                                                            args, said):
    """A name that reads as the pipeline's for an approver's key, a pipeline key under
    another name, or an unknown role: refused (exit 2) naming the rule; no key written."""
    code, out = run("keys", "create", *args, "--store-dir", str(tmp_path / "no-store"))
    assert code == 2 and said in out, out
    assert not (tmp_path / "keys").exists() or not any((tmp_path / "keys").rglob("*.pem"))


def test_a_key_folder_that_cannot_be_made_is_named_not_a_traceback(run, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for role_flags in (["--name", "dave"], ["--role", "pipeline"]):
        code, out = run("keys", "create", *role_flags, "--key-dir", str(blocker),
                        "--store-dir", str(tmp_path / "store"))
        assert code == 2 and f"cannot write a key under {blocker}" in out, out
        assert "Traceback" not in out


def test_an_approval_naming_a_key_folder_that_does_not_exist_is_refused(run, tmp_path):
    """A mistyped --key-dir holds no revocations: the check would pass unseen."""
    keys.create_key(tmp_path / "alice.pem")
    code, out = run("approve", "0f3c-run", "--key", str(tmp_path / "alice.pem"),
                    "--comment", "ship", "--key-dir", str(tmp_path / "no-such-folder"))
    assert code == 2 and "no such key folder" in out and "PREFECT_API_URL" not in out, out


def test_a_rollback_on_a_damaged_log_is_refused_in_a_line_and_moves_nothing(run, tmp_path,
                                                                           monkeypatch):
    import flows.rollback
    from lineage.log.family_log import LogDamaged

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "store"
    local_tracking(store).client().create_experiment("kernelgate-xla")

    def damaged(*_args):
        raise LogDamaged("entry 3 does not chain to entry 2")

    def flow_started(**_):
        raise AssertionError("the flow ran on a damaged log")

    monkeypatch.setattr(flows.rollback, "check_manual_rollback", damaged)
    monkeypatch.setattr(flows.rollback, "manual_rollback", flow_started)
    code, out = run("rollback", "--reason", "test", "--requested-by", "rm", "--family", "xla",
                    "--store-dir", str(store))
    assert code == 1 and "signed log is damaged, nothing moved: entry 3" in out, out
    assert "Traceback" not in out
