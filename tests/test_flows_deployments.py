"""Deployments and the CLI: the nightly schedule is declared, every entrypoint imports."""

from __future__ import annotations

from pathlib import Path

import yaml
from prefect import Flow
from prefect.client.schemas.schedules import CronSchedule
from prefect.flows import load_flow_from_entrypoint
from typer.testing import CliRunner

from flows.cli import app

ROOT = Path(__file__).parents[1]


def deployments() -> dict[str, dict]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return {d["name"]: d for d in spec["deployments"]}


def test_nightly_revalidation_is_scheduled_on_a_process_pool():
    nightly = deployments()["nightly-revalidation"]
    (schedule,) = nightly["schedules"]
    cron = CronSchedule(cron=schedule["cron"], timezone=schedule.get("timezone", "UTC"))
    minute, hour, *days = cron.cron.split()
    assert minute.isdigit() and hour.isdigit() and days == ["*", "*", "*"]  # once a day
    assert schedule.get("active", True)
    assert nightly["entrypoint"].endswith(":nightly_revalidation")
    # every family in production, each under its own registration: no family, no
    # thresholds file, no settings that a registration would otherwise be judged by
    assert not nightly.get("parameters")
    assert nightly["work_pool"]["name"]


def test_every_entrypoint_loads_as_a_flow(monkeypatch):
    monkeypatch.chdir(ROOT)
    names = {}
    for name, deployment in deployments().items():
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        assert isinstance(flow, Flow), name
        # the declared parameters bind to the flow's signature (pydantic-validated); only
        # the manual rollback leaves required fields (text) to the person's Run form
        declared = deployment.get("parameters", {})
        asked = set(flow.parameters.required or []) - set(declared)
        assert not asked or name == "manual-rollback", (name, asked)
        flow.validate_parameters({**dict.fromkeys(asked, "typed by a person"), **declared})
        names[name] = flow.name
    assert names == {"nightly-revalidation": "kernelgate-nightly-revalidation",
                     "candidate-rollout": "kernelgate-rollout",
                     "manual-rollback": "kernelgate-manual-rollback"}


def test_manual_rollback_form_is_typed():
    """The deployment's Run form asks for a reason and a requester, and a version number."""
    from flows.rollback import manual_rollback

    schema = manual_rollback.parameters.model_dump()
    props = schema["properties"]
    assert set(schema["required"]) == {"reason", "requested_by"}
    assert props["reason"]["minLength"] == 3
    assert any(t.get("type") == "integer" and t.get("minimum") == 1
               for t in props["to_version"].get("anyOf", [props["to_version"]]))


def _readme_commands() -> list[str]:
    """The subcommands README's command-line section documents (``kernelgate <cmd> ...``)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## The command line", 1)[1].split("\n## ", 1)[0]
    return sorted({line.split()[1] for line in section.splitlines()
                   if line.startswith("kernelgate ")})


def test_every_documented_command_exists():
    documented = _readme_commands()
    assert {"rollout", "evaluate", "revalidate", "audit", "ui"} <= set(documented)
    for command in documented:
        result = CliRunner().invoke(app, [command, "--help"])
        assert result.exit_code == 0, (command, result.output)
        assert f"{command} [OPTIONS]" in result.output, (command, result.output)


def test_cli_refuses_a_missing_thresholds_file_before_writing_anything(tmp_path):
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["rollout", "--thresholds", str(tmp_path / "nope.yaml"),
                                      "--store-dir", str(store)],
                                env={"COLUMNS": "400"})  # the error box must not wrap the path
    assert result.exit_code == 2, result.output  # a usage error, not a crash
    assert "nope.yaml" in result.output and "does not exist" in result.output
    assert not store.exists()


def test_cli_refuses_block_sizes_for_an_untiled_kernel(tmp_path):
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["rollout", "--implementation", "xla", "--block-q", "64",
                                      "--store-dir", str(store)])
    assert result.exit_code == 2 and "xla has no block sizes" in result.output, result.output
    assert not store.exists()


def test_the_cli_keeps_compiled_programs_in_the_store_unless_told_where(tmp_path, monkeypatch):
    import jax

    from flows import paths

    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert paths.compilation_cache(tmp_path / "store") is None
    assert jax.config.jax_compilation_cache_dir == before[0]
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    try:
        folder = paths.compilation_cache(tmp_path / "store")
        assert folder == (tmp_path / "store" / "jax-cache").resolve()
        assert jax.config.jax_compilation_cache_dir == str(folder)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
