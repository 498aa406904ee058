"""The command line as a process: ``--help`` is quick, ``kernelgate ui`` stops cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.stack_config import free_port

ROOT = Path(__file__).parents[1]
KERNELGATE = Path(sys.executable).parent / "kernelgate"


HEAVY = ("jax", "mlflow", "prefect", "great_expectations", "scipy", "rich")


def _python_lines(code: str) -> list[str]:
    """What ``python -c code`` prints, by line, in a fresh process of this checkout."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=120).stdout.splitlines()


@pytest.mark.parametrize("args", [
    ["rollout", "--implementation", "bogus"],
    ["rollout", "--family", "Bad Name!"],
    ["rollout", "--family", "nosuch"],
    ["rollout", "--thresholds", "README.md"],
    ["timeline", "--family", "nosuch"],
    ["audit", "--family", "nosuch"],
], ids=lambda a: " ".join(a))

def test_bad_arguments_are_refused_before_anything_heavy_is_imported(args, tmp_path):
    """Every bad-input refusal exits 2 naming the option before JAX, MLflow, Prefect,
    GX, SciPy or rich is imported (what makes it take well under a second: the figure
    is in BENCHMARKS.md, measured, not timed here)."""
    code = ("import sys\nfrom flows.cli import app\ntry:\n    app(args=sys.argv[1:])\n"
            "except SystemExit as e:\n    print('exit', e.code, sorted(m for m in "
            f"{HEAVY!r} if m in sys.modules))\n")
    store = ["--store-dir", str(tmp_path)] if args[0] != "rollout" or "nosuch" in args else []
    result = subprocess.run([sys.executable, "-c", code, *args, *store], capture_output=True,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "exit 2 []", (result.stdout, result.stderr)
    option = next(a for a in args if a.startswith("--"))
    assert option in result.stderr, result.stderr


def test_help_takes_at_most_a_second():
    """Measured as the CPU time of the process (wall time on a shared 2-core machine
    says more about the neighbours), and no heavy library is imported for it."""
    import resource

    subprocess.run([str(KERNELGATE), "--help"], check=True, capture_output=True)  # warm caches
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([str(KERNELGATE), "--help"], check=True, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert "rollout" in result.stdout and "notifications" in result.stdout
    assert cpu_s <= 1.0, f"kernelgate --help took {cpu_s:.2f} s of CPU"
    heavy = subprocess.run(
        [sys.executable, "-c", "import sys, flows.cli; "
         "print(sorted(m for m in ('jax', 'mlflow', 'prefect', 'great_expectations') if m in sys.modules))"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()
    assert heavy == "[]", heavy


def test_the_registry_and_the_error_base_import_no_jax():
    """``kernels`` is lazy: the registry (its names, without loading a kernel), the kernel
    base class and the one error base every package imports load neither JAX nor NumPy,
    so the CLI checks ``--implementation`` by importing the registry itself."""
    code = ("import sys, kernels, kernels.errors, kernels.kernel, kernels.registry\n"
            "names = sorted(kernels.registry.IMPLEMENTATIONS)\n"
            "print(names, sorted(m for m in ('jax', 'numpy', 'kernels.api', 'kernels.xla') "
            "if m in sys.modules))\n"
            "kernels.IMPLEMENTATIONS  # a lazy name: imports kernels.api, and JAX with it\n"
            "print('jax' in sys.modules)\n")
    out = _python_lines(code)
    assert out[0].endswith(" []") and "'pallas_gpu'" in out[0], out
    assert out[1] == "True"


def test_a_submodule_is_an_attribute_of_the_lazy_package_on_first_use():
    """``import kernels`` then ``kernels.registry.BUILTIN``, as tests/test_kernels_poisoned.py
    does at its top: it failed on the H200 when that module was collected alone (the lazy
    package knew its names but not its submodules); no JAX for it either."""
    code = ("import sys, kernels\nprint('naive' in kernels.registry.BUILTIN, "
            "'jax' in sys.modules)\ntry:\n    kernels.no_such_thing\n"
            "except AttributeError as err:\n    print(err)\n")
    out = _python_lines(code)
    assert out == ["True False",
                   "module 'kernels' has no attribute 'no_such_thing'"], out


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ui_stops_with_every_child_on(signum, tmp_path):
    port = free_port()
    children: list[str] = []
    ui = subprocess.Popen([str(KERNELGATE), "ui", "--store-dir", str(tmp_path / "store"),
                           "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise AssertionError("the MLflow UI never answered")
        children[:] = subprocess.run(["pgrep", "-P", str(ui.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert children, "kernelgate ui runs the server as a child process"
        server_pgid = int(children[0])  # the server leads its own process group
        ui.send_signal(signum)
        assert ui.wait(timeout=30) == 0
        deadline = time.monotonic() + 15
        while (_listening(port) or _group_alive(server_pgid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _listening(port), f"something still listens on :{port}"
        assert not _group_alive(server_pgid), "a child of the MLflow server outlived it"
    finally:
        if ui.poll() is None:
            ui.kill()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(child), signal.SIGKILL)


def test_a_misspelt_thresholds_file_is_refused_with_its_line_and_nothing_written(tmp_path):
    """A typo inside a criterion: exit 2 naming --thresholds, the file's line and the
    field meant, and no store folder created."""
    text = (ROOT / "thresholds" / "local-dry-run.yaml").read_text()
    bad = tmp_path / "typo.yaml"
    bad.write_text(text.replace("{name: nan-free, metric:", "{name: nan-free, metirc:"))
    store = tmp_path / "store"
    result = subprocess.run([str(KERNELGATE), "rollout", "--thresholds", str(bad),
                             "--store-dir", str(store)], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--thresholds" in result.stderr
    assert f"{bad}:16: platforms.tpu.value.0: unknown key 'metirc'; did you mean 'metric'?" \
        in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not store.exists()


def test_ui_on_a_busy_port_fails_naming_it(tmp_path):
    """Something already listens on the port: exit 2 naming --port and the port, no URL
    printed as if the UI were serving there, no store created."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([str(KERNELGATE), "ui", "--store-dir", str(tmp_path / "store"),
                                 "--port", str(port)], capture_output=True, text=True,
                                cwd=ROOT, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--port" in result.stderr and f"port {port} is in use" in result.stderr
    assert "MLflow UI on http" not in result.stdout
    assert not (tmp_path / "store").exists()


def test_a_server_that_exits_by_itself_is_a_failure():
    """``run_until_signalled``: a server that stops without being asked did not serve,
    even when it exits 0 (uvicorn does after a failed bind)."""
    from flows.cli_ops import run_until_signalled

    assert run_until_signalled([sys.executable, "-c", "pass"]) == 1
    assert run_until_signalled([sys.executable, "-c", "raise SystemExit(3)"]) == 3


@pytest.mark.parametrize("command", [["rollout"], ["audit"], ["timeline"], ["revalidate"],
                                     ["rollback", "--reason", "a test"], ["ui"]],
                         ids=lambda c: c[0])
def test_a_store_path_that_is_a_file_is_refused_naming_it(command, tmp_path):
    afile = tmp_path / "store"
    afile.write_text("not a folder")
    result = subprocess.run([str(KERNELGATE), *command, "--store-dir", str(afile)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"--store-dir: {afile} is a file, not a store folder" in result.stderr
    assert "Traceback" not in result.stderr and afile.read_text() == "not a folder"


def test_a_store_that_cannot_be_written_is_refused_before_anything_runs():
    """``/sys`` refuses new folders even to root (a read-only mount refuses the same way
    and the probe is a write, not a permission bit)."""
    result = subprocess.run([str(KERNELGATE), "rollout", "--store-dir", "/sys/kernel/kg/store"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "--store-dir: cannot write to /sys/kernel, where it would be created" in result.stderr
    assert "Traceback" not in result.stderr


def test_rollout_help_lists_every_exit_code_the_command_returns():
    """Each signed result's exit code (flows.errored.EXIT_CODES) is in ``rollout --help``,
    next to the result's name, as are 1 and 2 (before the record; bad arguments)."""
    import re

    from typer.testing import CliRunner

    from flows.cli import app
    from flows.errored import EXIT_CODES

    text = " ".join(CliRunner().invoke(app, ["rollout", "--help"], terminal_width=400).output.split())
    epilog = text[text.index("Exit codes:"):]
    for result, code in EXIT_CODES.items():
        clause = re.search(rf"\b{code} ([^;]*)", epilog)
        assert clause and result.replace("_", " ") in clause.group(1), (result, code, epilog)
    assert "1 a failure before the record opened" in epilog and "2 bad arguments" in epilog


def test_the_aa_gate_tool_explains_every_option_without_importing_jax():
    """``python -m tools.aa_gate --help`` exits 0 with a one-line help for each option,
    and prints it without importing JAX (the measurement imports it when it runs)."""
    code = ("import sys\nfrom tools.aa_gate import parser\n"
            "print([a.option_strings[-1] for a in parser()._actions if not a.help])\n"
            "print(sorted(m for m in ('jax', 'evaluation.performance') if m in sys.modules))\n")
    out = _python_lines(code)
    assert out == ["[]", "[]"], out
    shown = subprocess.run([sys.executable, "-m", "tools.aa_gate", "--help"], cwd=ROOT,
                           check=True, text=True, capture_output=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}).stdout
    for option in ("--runs", "--kernel", "--profile", "--shapes", "--repeats", "--warmup",
                   "--out"):
        line = next(x for x in shown.splitlines() if x.strip().startswith(option))
        assert len(line.split()) > 2, (option, shown)  # the option, its metavar, its help
