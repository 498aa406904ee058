"""The layering of ARCHITECTURE.md, checked from the source: who may import whom.

kernels and gates import nothing of ours above them and neither MLflow nor Prefect;
evaluation imports kernels (and neither MLflow nor Prefect); lineage imports gates,
kernels and evaluation, and MLflow but not Prefect; flows import everything; nothing
imports flows. Within lineage, each role (a subpackage) imports only the roles below it
(``LINEAGE_LAYERS``). Function-local imports count: a circle hidden inside a function is
still a circle. Modules stay small, or say in their docstring why not. Code, tests and
tools say why in words, not by session or issue number.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "evaluation", "gates", "lineage", "flows")
ALLOWED = {
    "kernels": {"kernels"},
    "gates": {"gates"},
    "evaluation": {"evaluation", "kernels"},
    "lineage": {"lineage", "gates", "kernels", "evaluation"},
    "flows": set(PACKAGES),
}
FORBIDDEN_LIBRARIES = {
    "kernels": {"mlflow", "prefect"},
    "gates": {"mlflow", "prefect"},
    "evaluation": {"mlflow", "prefect"},
    "lineage": {"prefect"},
    "flows": set(),
}
MAX_LINES = 350
SHARED_LEAVES = {"kernels.errors"}
"""Leaf modules (importing nothing) every package may import: the common error base."""


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out[".".join(parts)] = path
    return out


def _imports(path: Path) -> set[str]:
    """Every module name imported anywhere in the file (top level or inside functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


MODULES = _modules()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_layering(module):
    package = module.split(".")[0]
    ours = {name.split(".")[0] for name in _imports(MODULES[module])
            if name not in SHARED_LEAVES and name.rsplit(".", 1)[0] not in SHARED_LEAVES
            } & set(PACKAGES)
    assert ours <= ALLOWED[package], f"{module} imports {sorted(ours - ALLOWED[package])}"
    libraries = {name.split(".")[0] for name in _imports(MODULES[module])}
    assert not libraries & FORBIDDEN_LIBRARIES[package], \
        f"{module} imports {sorted(libraries & FORBIDDEN_LIBRARIES[package])}"


def test_no_import_cycles_between_modules():
    """Edges to a package's ``__init__`` (``from kernels import x``) are left out: an
    ``__init__`` that re-exports its submodules is the normal shape of a package."""
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    graph = {m: {n for n in _imports(p) if n in MODULES and n != m and n not in packages}
             for m, p in MODULES.items()}
    done, stack, cycles = set(), [], []

    def visit(node):
        if node in stack:
            cycles.append(" -> ".join(stack[stack.index(node):] + [node]))
            return
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        stack.pop()
        done.add(node)

    for module in sorted(graph):
        visit(module)
    assert not cycles, cycles


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_are_small_or_say_why(module):
    path = MODULES[module]
    lines = len(path.read_text().splitlines())
    if lines <= MAX_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert f"over {MAX_LINES} lines" in doc, (
        f"{module} has {lines} lines; split it or say in its docstring why it is "
        f"kept 'over {MAX_LINES} lines'")


ROLLOUT_STAGES = ("preregister", "build", "prepare_testset", "evaluate", "gate",
                  "canary_calibration", "record_traffic", "approve", "shadow", "enter_canary",
                  "canary_step", "canary_verdict", "adoption_verdict", "confirm", "promote")
"""The stage list of the design notes, in order (approval is asked three times). The
canary's calibration is looked up right after the gate: a plan that will refuse for want
of one says so before any person is asked to approve a step."""


def _stage_list() -> tuple[ast.FunctionDef, list[str]]:
    """The function of flows/rollout.py that calls the stages (found by its calls, not
    by its name), and the stages it calls, in source order, repeats dropped."""
    tree = ast.parse((ROOT / "flows" / "rollout.py").read_text())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]

    def calls(fn: ast.FunctionDef) -> list[str]:
        found = sorted((n.lineno, n.col_offset, n.func.id) for n in ast.walk(fn)
                       if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                       and n.func.id in ROLLOUT_STAGES)
        return list(dict.fromkeys(name for _, _, name in found))

    holders = [fn for fn in functions if set(calls(fn)) == set(ROLLOUT_STAGES)]
    assert len(holders) == 1, [fn.name for fn in holders]
    return holders[0], calls(holders[0])


def test_the_rollout_stage_list_fits_on_a_screen_and_runs_the_stages_in_order():
    holder, stages = _stage_list()
    assert holder.end_lineno - holder.lineno + 1 <= 45, (
        f"{holder.name} is {holder.end_lineno - holder.lineno + 1} lines")
    assert tuple(stages) == ROLLOUT_STAGES
    tree = ast.parse((ROOT / "flows" / "rollout.py").read_text())
    (flow_fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "rollout"]
    assert flow_fn.end_lineno - flow_fn.lineno <= 15
    assert holder.name in {n.func.id for n in ast.walk(flow_fn)
                           if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def test_stages_return_results_and_nothing_is_written_into_the_context():
    """Every stage task returns a value (its typed result) or nothing, and no flow
    module assigns to an attribute of the session context or its record."""
    offenders = []
    for module, path in MODULES.items():
        if not module.startswith("flows."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            for target in targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id in {"ctx", "context", "state"}):
                    offenders.append(f"{module}:{node.lineno}")
    assert not offenders, offenders
    from dataclasses import FrozenInstanceError

    from flows.results import RolloutContext

    assert RolloutContext.__dataclass_params__.frozen
    with pytest.raises(FrozenInstanceError):
        RolloutContext.__new__(RolloutContext).__setattr__("settings", None)


def test_tag_names_live_in_one_module():
    """No ``kernelgate.*`` or ``mlflow.*`` tag literal outside lineage/store/tags.py."""
    offenders = []
    for module, path in MODULES.items():
        if module == "lineage.store.tags":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith(("kernelgate.", "mlflow.note", "mlflow.parent"))):
                offenders.append(f"{module}: {node.value!r}")
    assert not offenders, offenders


# ----------------------------------------------------------------------------- lineage

_BELOW_SERVING = {"lineage.store", "lineage.signing", "lineage.log", "lineage.records",
                  "lineage.aliases"}
LINEAGE_LAYERS: dict[str, set[str]] = {
    "lineage.store": set(),
    "lineage.signing": {"lineage.store"},
    "lineage.log": {"lineage.store", "lineage.signing"},
    "lineage.records": {"lineage.store", "lineage.signing", "lineage.log"},
    "lineage.aliases": {"lineage.store", "lineage.signing", "lineage.log", "lineage.records"},
    "lineage.serving": _BELOW_SERVING,
    "lineage.rollout": _BELOW_SERVING | {"lineage.serving"},
    "lineage.audit": _BELOW_SERVING | {"lineage.serving"},
    "lineage.family_store": _BELOW_SERVING,
    "lineage.tools": _BELOW_SERVING | {"lineage.serving", "lineage.rollout", "lineage.audit"},
    "lineage.model": set(),
}
"""The roles of ``lineage`` (a subpackage each, or a module of its own) and the roles
each may import besides itself, bottom up: the store (MLflow itself), signing, the
family log, the records a rollout signs, the registered model and its aliases, serving
(a version as a model and its runners), then the runs of a rollout and the audit side
by side; ``family_store`` is the family's one object over the records, log and aliases;
``tools`` (benchmarks) may import every role and no role imports it. ``lineage.model``,
the pyfunc wrapper every stored version names by that path, imports none of them and
every role may import it."""
LINEAGE_SHARED = {"lineage.model"}


def lineage_role(name: str) -> str | None:
    """The role of a module (or an imported name) of ``lineage``; None for the package."""
    parts = name.split(".")
    if parts[0] != "lineage" or len(parts) < 2:
        return None
    role = ".".join(parts[:2])
    return role if role in LINEAGE_LAYERS else name


def lineage_violations(imports: dict[str, set[str]]) -> list[str]:
    """``module -> role`` for each import of a ``lineage`` module that its role may not
    make (``imports``: module -> the names it imports), and each module in no role."""
    found = []
    for module, names in sorted(imports.items()):
        role = lineage_role(module)
        if role is None:
            continue
        if role not in LINEAGE_LAYERS:
            found.append(f"{module}: in no role of LINEAGE_LAYERS")
            continue
        allowed = LINEAGE_LAYERS[role] | LINEAGE_SHARED | {role}
        found += [f"{module} -> {r}" for r in sorted({lineage_role(n) for n in names} - {None})
                  if r not in allowed]
    return found


def declared_cycles(layers: dict[str, set[str]]) -> list[str]:
    """Circles in the declaration itself (a role that may import, through others, itself)."""
    cycles = []

    def visit(role: str, path: list[str]) -> None:
        for nxt in sorted(layers.get(role, ())):
            if nxt in path:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            else:
                visit(nxt, path + [nxt])

    for role in sorted(layers):
        visit(role, [role])
    return sorted(set(cycles))


def test_lineage_roles_are_layered_without_circles():
    assert declared_cycles(LINEAGE_LAYERS) == []
    imports = {m: _imports(p) for m, p in MODULES.items() if m.startswith("lineage.")}
    assert lineage_violations(imports) == []
    assert not any(lineage_role(m) == "lineage.tools" for names in
                   [_imports(p) for m, p in MODULES.items() if not m.startswith("lineage.tools")]
                   for m in names), "nothing imports lineage.tools"
    roles = {lineage_role(m) for m in MODULES if m.startswith("lineage.")}
    assert roles == set(LINEAGE_LAYERS), sorted(roles ^ set(LINEAGE_LAYERS))


def test_the_lineage_layering_check_finds_planted_violations():
    planted = {"lineage.store.tags": {"lineage.audit.audit"},  # an arrow back up
               "lineage.records.records": {"lineage.aliases", "lineage.aliases.registry"},
               "lineage.serving.versions": {"lineage.model", "lineage.store.tracking"},
               "lineage.dispatch_policy": {"lineage.store.tracking"}}  # in no role
    assert lineage_violations(planted) == [
        "lineage.dispatch_policy: in no role of LINEAGE_LAYERS",
        "lineage.records.records -> lineage.aliases",
        "lineage.store.tags -> lineage.audit"]
    circle = {**LINEAGE_LAYERS, "lineage.store": {"lineage.audit"}}
    assert "lineage.store -> lineage.audit -> lineage.store" in declared_cycles(circle)


def test_shared_leaves_import_nothing_of_ours():
    for leaf in SHARED_LEAVES:
        ours = {n.split(".")[0] for n in _imports(MODULES[leaf])} & set(PACKAGES)
        assert not ours, f"{leaf} must stay a leaf, imports {sorted(ours)}"


def test_every_exception_class_derives_from_kernelgate_error():
    """One base for every deliberate error: ``except KernelgateError`` catches them all."""
    import importlib
    import inspect

    from kernels.errors import KernelgateError

    offenders = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
        if not names:
            continue
        loaded = importlib.import_module(module)
        for name in names:
            cls = getattr(loaded, name, None)
            if (inspect.isclass(cls) and issubclass(cls, BaseException)
                    and not issubclass(cls, KernelgateError)):
                offenders.append(f"{module}.{name}")
    assert not offenders, offenders


def test_every_module_is_in_the_architecture_table():
    """ARCHITECTURE.md's module table is drawn from the code: every module of the five
    packages has a row (by its name, its folder, or a group row naming it)."""
    import re

    text = (ROOT / "ARCHITECTURE.md").read_text()
    table = text[text.index("| package | module |"):text.index("## Where each invariant")]
    named = set(re.findall(r"`([A-Za-z_][\w/]*)`", table))
    missing = []
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        parts = module.split(".")[1:]
        if not ({parts[-1], "/".join(parts)} & named or f"{parts[0]}/" in named):
            missing.append(module)
    assert not missing, f"modules without a row in ARCHITECTURE.md: {missing}"


HISTORY = re.compile(r"(session|issue)s?[\s#_-]*[0-9]+", re.IGNORECASE)
"""A session or issue number: one or more, any case, spaced, hyphenated, underscored (a
test's name) or broken over two lines of a comment or docstring. The why of a line is kept
in words (a date is fine); measured history belongs in BENCHMARKS.md and the notes."""

HISTORY_STILL_TO_CLEAN: frozenset[str] = frozenset()
"""Paths (``fnmatch`` patterns) still being cleaned of session and issue numbers in other
branches; :func:`test_no_session_or_issue_numbers_in_code_or_tests` skips them. Empty it
once those branches are merged."""


def _history_scanned() -> list[Path]:
    """Every Python file of the five packages (``kernels/tools`` included, its
    ``bench_results`` data not) and of ``tests/``, and the scripts of ``tools/``."""
    files = [p for top in (*PACKAGES, "tests") for p in (ROOT / top).rglob("*.py")
             if "bench_results" not in p.parts and "__pycache__" not in p.parts]
    return sorted(files + [*(ROOT / "tools").glob("*.py"), *(ROOT / "tools").glob("*.sh")])


def history_references(text: str) -> list[tuple[int, str]]:
    """``(line, what)`` of every session or issue number in ``text`` (the line it starts on)."""
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group(0).split()))
            for m in HISTORY.finditer(text)]


def test_no_session_or_issue_numbers_in_code_or_tests():
    from fnmatch import fnmatch

    offenders = []
    for path in _history_scanned():
        rel = path.relative_to(ROOT).as_posix()
        if any(fnmatch(rel, pattern) for pattern in HISTORY_STILL_TO_CLEAN):
            continue
        offenders += [f"{rel}:{line}: {what!r}"
                      for line, what in history_references(path.read_text())]
    assert not offenders, ("say why in words, not by session or issue number:\n"
                           + "\n".join(offenders))


def _late_imports(text: str) -> list[int]:
    """Lines of module-level imports that follow other statements (after the docstring and
    ``from __future__``): what ruff's E402 flags and a ``# noqa: E402`` silences."""
    body = ast.parse(text).body
    seen_code, late = False, []
    for i, node in enumerate(body):
        if isinstance(node, ast.Import | ast.ImportFrom):
            if seen_code:
                late.append(node.lineno)
        elif not (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            seen_code = True
    return late


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_come_first_in_every_module(module):
    """No environment set or backend chosen between imports: a module that needs a
    setting before a library's import gets it from its package's ``__init__``
    (``flows/__init__.py``), so tools that follow imports read the file top down."""
    late = _late_imports(MODULES[module].read_text())
    assert not late, f"{module}: imports after other statements at lines {late}"


def test_the_late_import_check_finds_a_planted_one():
    planted = '"""doc."""\nfrom __future__ import annotations\nimport os\n' \
              'os.environ.setdefault("X", "1")\nimport json\n'
    assert _late_imports(planted) == [5]
    assert _late_imports('"""doc."""\nimport os\nimport json\nX = 1\n') == []


def test_the_history_scanner_finds_what_is_planted_and_nothing_else():
    s, i = "session", "issue"  # split, so that this file holds no reference itself
    planted = (f'"""Fixed in {s} 11.\n\nSee {i}s 19-21 and {s}s 11 and 13."""\n'
               f"# as {i}\n# 24 said\n"
               f"def test_the_modules_measured_in_{s}_8(): ...\n"
               f"PATH = 'h200-2026-12-02-{s}10/grid.json'\n")
    assert history_references(planted) == [
        (1, f"{s} 11"), (3, f"{i}s 19"), (3, f"{s}s 11"), (4, f"{i} # 24"),
        (6, f"{s}_8"), (7, f"{s}10")]
    clean = (f"# the {s}'s store, {i}d on 2026-12-01 (H200, 132 SMs)\n"
             f"{s}_id = 3\nfor {s} in sessions: pass\n")
    assert history_references(clean) == []


REGISTERED_SETTINGS = ("thresholds", "perf_shapes", "perf_repeats", "model_check",
                       "shadow_requests", "testset_profile", "testset_profile_for")
"""The settings a registration freezes or binds (the thresholds file's bytes; the perf
shapes and repeats, MiniLM check, shadow size and test-set profile: ``lineage.records.bindings``)."""
READ_BEFORE_REGISTRATION = {
    ("flows.plan", "resolve_plan"),  # the plan: the file's bytes read and parsed once
    ("flows.tasks", "preregister"),  # names the file in the registration's messages
    ("flows.tasks", "rollout_bindings"),  # what the registration binds
    # a registration made before bindings existed: the session's settings stand in
    ("flows.results", "perf_shapes"), ("flows.results", "perf_repeats"),
    ("flows.results", "model_check"), ("flows.results", "shadow_requests"),
    ("flows.judge", "build"),  # the build-only flow has no registration
}
"""(module, function) pairs that may read those settings: the plan, the registration
and its legacy fallback. Every other stage reads the registration (``Preregistered``)."""


def _settings_reads(module: str) -> set[tuple[str, str]]:
    """``(function, setting)`` for each read of ``<...>settings.<setting>`` in a
    function of ``module`` (the innermost enclosing function names it)."""
    found = set()

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = (child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                    else function)
            if (isinstance(child, ast.Attribute) and child.attr in REGISTERED_SETTINGS
                    and ((isinstance(child.value, ast.Name) and child.value.id == "settings")
                         or (isinstance(child.value, ast.Attribute)
                             and child.value.attr == "settings"))):
                found.add((function, child.attr))
            visit(child, name)

    visit(ast.parse(MODULES[module].read_text()), "<module>")
    return found


def test_after_preregistration_stages_read_the_registration_not_the_settings():
    """The thresholds file and the verdict-changing settings are read where the plan is
    resolved and the registration made; every later stage (evaluation, gate, traffic,
    confirmation, re-validation) reads what the registration froze and bound."""
    flows = [m for m in MODULES if m.startswith("flows.") and not m.startswith("flows.cli")]
    reads = {(module, function, setting) for module in flows
             for function, setting in _settings_reads(module)}
    assert {(m, f) for m, f, _ in reads} <= READ_BEFORE_REGISTRATION, sorted(
        r for r in reads if r[:2] not in READ_BEFORE_REGISTRATION)


def test_the_settings_scanner_finds_a_planted_read(tmp_path, monkeypatch):
    planted = tmp_path / "planted.py"
    planted.write_text("def evaluate(context):\n    return context.settings.perf_repeats\n")
    monkeypatch.setitem(MODULES, "flows.planted", planted)
    assert _settings_reads("flows.planted") == {("evaluate", "perf_repeats")}


# ----------------------------------------------------------------------------- kernels


def _kernel_classes(tree: ast.Module) -> list[ast.ClassDef]:
    """The module's ``Kernel`` subclasses: a base named ``Kernel`` (``Kernel[...]``,
    ``kernels.Kernel``) or another class of the module that is one."""
    found: dict[str, ast.ClassDef] = {}

    def base_name(base: ast.expr) -> str | None:
        if isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(base, ast.Attribute):
            return base.attr
        return base.id if isinstance(base, ast.Name) else None

    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    changed = True
    while changed:
        changed = False
        for cls in classes:
            if cls.name not in found and any(
                    base_name(b) == "Kernel" or base_name(b) in found for b in cls.bases):
                found[cls.name] = cls
                changed = True
    return list(found.values())


def _methods(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    return [n for n in cls.body if isinstance(n, ast.FunctionDef)]


KERNEL_METHODS = {f.name for cls in ast.parse((ROOT / "kernels" / "kernel.py").read_text()).body
                  if isinstance(cls, ast.ClassDef) and cls.name == "Kernel"
                  for f in _methods(cls)}
"""The methods of ``kernels.kernel.Kernel`` (every kernel class has them)."""


def shell_methods(source: str) -> list[str]:
    """``Class.method -> function`` for each method of a ``Kernel`` subclass whose body
    (docstring aside) is one call of a module-level function of the same module."""
    tree = ast.parse(source)
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    out = []
    for cls in _kernel_classes(tree):
        for method in _methods(cls):
            body = [s for s in method.body if not (isinstance(s, ast.Expr)
                    and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))]
            if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr):
                continue
            call = body[0].value
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id in functions):
                out.append(f"{cls.name}.{method.name} -> {call.func.id}")
    return out


def copied_methods(source: str) -> list[str]:
    """Module-level functions of a kernel module (one declaring a ``Kernel`` subclass)
    named like a ``Kernel`` method or a method of the module's kernel classes."""
    tree = ast.parse(source)
    classes = _kernel_classes(tree)
    if not classes:
        return []
    names = KERNEL_METHODS | {m.name for cls in classes for m in _methods(cls)}
    return sorted(n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                  and n.name in names and not n.name.startswith("__"))


OLD_SHAPE = '''
def check_supported(spec, backend, config=None):
    pass

class OldKernel(Kernel):
    def check_supported(self, spec, backend, config=None):
        """The shell."""
        check_supported(spec, backend, config)

class Deeper(OldKernel):
    def resolve_config(self, spec, config):
        return check_supported(spec, None, config)
'''


def test_the_kernel_checks_find_the_old_shape():
    assert shell_methods(OLD_SHAPE) == ["OldKernel.check_supported -> check_supported",
                                        "Deeper.resolve_config -> check_supported"]
    assert copied_methods(OLD_SHAPE) == ["check_supported"]
    assert {"check_supported", "resolve_config", "export_context"} <= KERNEL_METHODS


def test_no_kernel_method_is_a_shell_and_no_module_function_copies_one():
    """A kernel's knowledge lives on its class: no ``Kernel`` method is a one-line call of
    a module-level function of its module, and no module-level function of a kernel
    module carries a ``Kernel`` method's name."""
    shells, copies = [], []
    for module, path in MODULES.items():
        source = path.read_text()
        shells += [f"{module}: {s}" for s in shell_methods(source)]
        copies += [f"{module}.{name}" for name in copied_methods(source)]
    assert not shells, shells
    assert not copies, copies
    assert any(_kernel_classes(ast.parse(p.read_text())) for m, p in MODULES.items()
               if m == "kernels.pallas_gpu")
