"""The arguments of ``kernelgate rollout`` and ``evaluate`` turned into the rollout's
settings and plan (``flows.plan``), every argument checked before anything is written:
the fast checks first (``flows.cli_args``: no JAX), then the kernel, the thresholds and
the family, which need the kernels and the store. For ``--implementation auto`` the
store's production dispatch policy is read once here (``flows.plan.store_auto_policy``)
and both the thresholds' choice and the plan see it; a rollout for which that policy is
its own family's production already has nothing to roll out (``flows.plan.NothingToRollOut``:
``kernelgate rollout`` refuses it with exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from flows import prefect_server
from flows.cli_args import check_family, check_implementation, check_store_dir, check_thresholds
from flows.cli_keys import check_name
from flows.cli_store import fail_fast_if_down, families, open_store
from flows.paths import compilation_cache


def plan_arguments(implementation: str, thresholds: Path | None, store_dir: Path,
                   block_q: int | None, block_kv: int | None, family: str | None,
                   new_family: bool, key_dir: Path | None, dispatch_policy: Path | None = None,
                   **extra):
    """The rollout's settings and its plan (``flows.plan``: kernel, thresholds, family),
    resolved once here and handed to the flow; bad arguments refused before anything is
    logged, built or evaluated. The kernel and thresholds lines are printed (stderr).

    Raises:
        typer.BadParameter: an argument refused (named), the environment's dispatch
            policy refused for ``auto``.
        typer.Exit: the store does not answer (exit 1).
    """
    # What needs neither JAX nor the store first: a bad argument is refused in < 1 s.
    check_implementation(implementation)
    policy = None
    if implementation == "dispatch" or dispatch_policy is not None:
        from flows.dispatch_candidate import audited_policy
        from kernels.api import default_backend

        try:  # a dispatch policy is audited before anything is written
            policy = audited_policy(implementation, dispatch_policy, default_backend())
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--dispatch-policy") from None
    check_store_dir(store_dir, writes=True)
    check_family(family, implementation, store_dir, new_family=new_family,
                 remote=bool(os.environ.get("MLFLOW_TRACKING_URI")))
    check_thresholds(thresholds)
    fail_fast_if_down()
    prefect_server.start_early()  # comes up on the other core while JAX etc. import
    compilation_cache(store_dir)
    import kernels
    from flows.dispatch_candidate import serving
    from flows.judge import BUILD_SHAPE
    from flows.plan import resolve_plan, store_auto_policy
    from flows.settings import RolloutSettings

    backend = kernels.default_backend()
    auto = None
    if implementation == "auto":  # the store's production dispatch policy, if it serves
        try:
            auto = store_auto_policy(RolloutSettings(store_dir=store_dir, key_dir=key_dir),
                                     backend)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--implementation") from None
        policy = auto.policy
    with serving(policy):  # the policy's kernel, for the plan's checks
        try:
            if thresholds is None:
                from flows.kernel_choice import default_thresholds

                thresholds, why = default_thresholds(implementation, backend, auto)
                typer.echo(f"thresholds: {why}", err=True)
            config = {k: v for k, v in {"block_q": block_q, "block_kv": block_kv}.items()
                      if v is not None} or None
            settings = RolloutSettings(implementation=implementation,
                                       thresholds=thresholds.resolve(), store_dir=store_dir,
                                       config=config, family=family, key_dir=key_dir,
                                       dispatch_policy=dispatch_policy, **extra)
            plan = resolve_plan(settings, backend, auto)
            typer.echo(f"kernel: {plan.why}", err=True)
            impl = kernels.IMPLEMENTATIONS[plan.implementation]
            impl.config_from(config)  # the candidate's own config type reads the block sizes
            spec, _, _ = kernels.validate(*BUILD_SHAPE.structs(), causal=BUILD_SHAPE.causal)
            impl.check_supported(spec, backend, config)
        except (ValueError, NotImplementedError) as err:
            raise typer.BadParameter(f"{err}") from None
    if family is not None:
        check_name(family)
        tracking = open_store(store_dir, must_exist=False)
        if family not in families(tracking) and family != plan.implementation and not new_family:
            raise typer.BadParameter(
                f"no family {family!r} in this store yet (families: {families(tracking) or 'none'}); "
                "pass --new-family to start one", param_hint="--family")
        if family not in families(tracking):
            from lineage.log.log_writer import earlier_log
            from lineage.signing.keys import default_key_dir

            why = earlier_log(tracking, family, key_dir or default_key_dir())
            if why is not None:
                raise typer.BadParameter(why, param_hint="--family")
    else:
        open_store(store_dir, must_exist=False)
    return settings, plan
