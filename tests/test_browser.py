"""What a release manager and an auditor see, in a real browser (headless Chromium,
driven by Playwright, 1280 px wide): a paused rollout approved at both transitions
through the Prefect UI's form, one sent a whitespace-only approver (refused, saying why
in the re-asked form) and then rejected, and the auditor's path in the MLflow UI from its
home page to the version behind ``production``, its not-assessed caveat and each run its
description links, with no GenAI page on the way.

One store per test run (module scope), made by real rollouts: ``--implementation
native`` (xla on this CPU host, family ``xla``: a real family, so the screenshots that
``make docs-screenshots`` copies into ``docs/`` show one) under the tests-only profile
``tests/data/thresholds-browser.yaml`` (staging-style UI approval; a canary too small
for its latency test's power, so latency is not assessed there, with that reason). The
tests run in file order: the approval promotes the version the auditor follows.

The last test is README's walkthrough itself, in a store of its own that starts empty:
``kernelgate calibrate`` and two ``kernelgate rollout`` commands under the shipped
``thresholds/staging.yaml``, run as the README's user runs them (subprocesses reporting to
this module's Prefect server), answered in the UI.

Needs ``/usr/bin/chromium`` (Debian's ``chromium``; ``.ci/run`` installs it) and the
``playwright`` package (dev extra). Run with ``make test-browser``. Screenshots go to
``$KERNELGATE_SCREENSHOTS`` (default ``<pytest tmp>/screenshots``).
"""

from __future__ import annotations

import contextvars
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import httpx
import pytest

from flows.stack_config import free_port
from kernels.shapes import AttentionShape

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).parents[1]
THRESHOLDS = Path(__file__).parent / "data" / "thresholds-browser.yaml"
WIDTH = 1280  # the narrowest desktop the form's evidence tables must fit
GENAI = re.compile(r"traces|evaluation|genai|prompts|chat-sessions|gateway", re.I)
"""What a GenAI view's address holds (MLflow 3.17's routes); no model-training one does."""
SMALL_SHAPE = [AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                              head_dim=32, dtype="float32", causal=False)]


def _wait_http(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("KERNELGATE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail("no /usr/bin/chromium: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": WIDTH, "height": 1000})
    context.set_default_timeout(120_000)  # a loaded 2-core machine renders slowly
    context.set_default_navigation_timeout(180_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture(scope="module")
def prefect_ui(tmp_path_factory):
    """``prefect server start`` (with its UI) on a free port and a throwaway database;
    this process's flows report to it."""
    import prefect.settings

    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_API_URL=api,
               PREFECT_UI_API_URL=api, PREFECT_SERVER_ANALYTICS_ENABLED="false")
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
         "--port", str(port)], env=env, stdout=(home / "server.log").open("w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_http(f"{api}/health")
        with prefect.settings.temporary_settings(updates={prefect.settings.PREFECT_API_URL: api}):
            yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The one store of this test run: the test set here; the rollouts below fill it."""
    from evaluation.testset import build_testset

    root = tmp_path_factory.mktemp("browser-store")
    build_testset(root / "testset", profile="ci")
    return root


@pytest.fixture
def settings(store, monkeypatch):
    """What ``kernelgate rollout --implementation native --thresholds
    tests/data/thresholds-browser.yaml`` runs, at the flow tests' small sizes."""
    from flows.settings import RolloutSettings

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return RolloutSettings(implementation="native", thresholds=THRESHOLDS,
                           testset_dir=store / "testset", store_dir=store / "store",
                           shadow_requests=8, perf_repeats=3, perf_shapes=SMALL_SHAPE,
                           model_check=False)


@pytest.fixture(scope="module")
def family() -> str:
    """The family ``--implementation native`` rolls out here (xla on a CPU host)."""
    import kernels

    return kernels.native_flash_kernel("native", kernels.default_backend())


def _paused_run_id(transition: str, result: dict, attempt: int = 0,
                   timeout_s: float = 900) -> str:
    """The flow run that waits for ``transition``'s approval (its ``attempt``-th ask: a
    refused answer is asked again under a new key), once its form exists."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    from flows import promotion

    key = promotion.pause_key(transition, attempt)
    schema_key = f"paused-{key}-schema"
    paused = FlowRunFilter(state=FlowRunFilterState(
        type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            if "error" in result:
                raise AssertionError(f"the rollout failed: {result['error']!r}")
            if "state" in result:  # ended without asking: say how, not wait out the timeout
                state = result["state"]
                raise AssertionError(f"the rollout ended as {state.name} before asking for "
                                     f"{transition}: {state.message}")
            for run in client.read_flow_runs(flow_run_filter=paused):
                if run.state is None or run.state.state_details.pause_key != key:
                    continue  # another ask (or a run an earlier test left paused)
                try:
                    client.read_flow_run_input(flow_run_id=run.id, key=schema_key)
                except Exception:  # noqa: BLE001 - paused, but the form is not saved yet
                    continue
                return str(run.id)
            time.sleep(0.5)
    raise AssertionError("the rollout never paused for approval")


def _rollout_in_background(settings):
    from flows.end_states import outcome_of
    from flows.rollout import rollout

    result: dict = {}

    def run():
        try:
            result["state"] = rollout(settings, return_state=True)
            result["outcome"] = outcome_of(result["state"])  # here: no event loop in this thread
        except BaseException as err:  # noqa: BLE001 - reported by the test
            result["error"] = err
    # The flow reports to this test's server: its settings live in a context variable.
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(run,), daemon=True)
    thread.start()
    return thread, result


def _choose(page, control, choice: str) -> None:
    """Pick ``choice`` in Prefect's p-select. Its list of ``role=option`` entries did not
    open on a plain click in headless Chromium (seen 2026-12-01), but opens from the
    keyboard once the control has focus: try each until the options show."""
    options = page.locator(".p-select-option")
    control.click()
    for key in ("Space", "Enter", "ArrowDown"):
        try:
            options.first.wait_for(state="visible", timeout=2_000)
            break
        except Exception:  # noqa: BLE001 - not open yet: the next key
            control.press(key)
    options.filter(has_text=choice).first.click()


def _open_form(page, base: str, run_id: str, transition: str):
    """Open the paused run, click *Resume*; the form's dialog once its heading shows."""
    page.goto(f"{base}/runs/flow-run/{run_id}")
    page.get_by_role("button", name="Resume").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text(f"Approve `{transition}`", exact=False).or_(
        dialog.get_by_text(f"Approve {transition}", exact=False)).first.wait_for()
    return dialog


def _answer(page, dialog, *, decision: str, approver: str, comment: str,
            screenshot: Path, show=None) -> None:
    """Fill the open form, screenshot it with ``show`` (a locator; default the form's
    heading) scrolled into view, and submit."""
    # the decision is a required choice (an enum: Prefect's form renders its p-select, a
    # button that opens a list of role=option entries; it starts empty)
    _choose(page, dialog.locator(".p-select-button__control").first, decision)
    boxes = dialog.locator("textarea")
    boxes.nth(0).fill(approver)
    boxes.nth(1).fill(comment)
    (show or dialog.get_by_role("heading", name=re.compile("Approve")).first
     ).scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot))
    with page.expect_response(lambda r: r.request.method == "POST"
                              and r.url.endswith("/resume")):
        dialog.get_by_role("button", name="Submit").click()
    _park(page)


def _park(page) -> None:
    """Leave Prefect's pages while the rollout runs on: an open flow-run page kept
    headless Chromium rendering at about one core (30 CPU-s in 30 s, measured on the 2-core
    host; 1 on ``about:blank``), taken from the tests beside it for minutes a wait."""
    page.goto("about:blank")


_UNCLIPPED = """el => {
  // true when no ancestor that clips (overflow other than visible) cuts the element off
  // sideways, and the window shows it: the column can be read without scrolling
  const r = el.getBoundingClientRect();
  for (let a = el.parentElement; a; a = a.parentElement) {
    if (getComputedStyle(a).overflowX === 'visible') continue;
    const q = a.getBoundingClientRect();
    if (r.right > q.right + 1 || r.left < q.left - 1) return false;
  }
  return r.left >= 0 && r.right <= window.innerWidth;
}"""


def _columns_readable(dialog, names: list[str]) -> list[str]:
    """The ones of ``names`` (canary table column headers) cut off in the dialog."""
    cut = []
    for name in names:
        header = dialog.locator("th").filter(has_text=name).first
        header.wait_for()
        if not header.evaluate(_UNCLIPPED):
            cut.append(name)
    return cut


def _final_state_shown(page, base: str, run_id: str, name: str, screenshot: Path) -> None:
    page.goto(f"{base}/runs/flow-run/{run_id}")
    page.get_by_text(name, exact=True).first.wait_for(timeout=60_000)
    page.screenshot(path=str(screenshot))
    _park(page)


def test_release_manager_approves_both_transitions_and_the_rollout_is_promoted(
        prefect_ui, settings, family, page, screenshots, store):
    from lineage.aliases import registered_model
    from lineage.store.tracking import local_tracking

    thread, result = _rollout_in_background(settings)
    run_id = _paused_run_id("shadow->canary", result)
    dialog = _open_form(page, prefect_ui, run_id, "shadow->canary")
    _answer(page, dialog, decision="approve", approver="rm@example.com",
            comment="evidence read; go", screenshot=screenshots / "prefect-approval-form.png")
    run_id = _paused_run_id("canary->production", result)
    dialog = _open_form(page, prefect_ui, run_id, "canary->production")
    # at 1280 px the canary table's last columns (the p-value with its alpha, the
    # result) are readable, not cut off by the dialog (at 1400 px they once were)
    assert _columns_readable(dialog, ["p (α)", "result"]) == []
    _answer(page, dialog, decision="approve", approver="rm@example.com",
            comment="canary read; ship", screenshot=screenshots / "prefect-production-form.png",
            show=dialog.locator("th").filter(has_text="p (α)").first)
    thread.join(timeout=900)
    assert "error" not in result, result.get("error")
    state = result["state"]
    assert state.name == "Promoted", state.message
    assert "not assessed" in state.message  # the canary's latency, in the verdict line
    outcome = result["outcome"]
    assert registered_model.alias_version(local_tracking(store / "store"), family,
                                          "production") == outcome.version
    _final_state_shown(page, prefect_ui, run_id, "Promoted", screenshots / "prefect-promoted.png")


def test_release_manager_sees_why_a_blank_approver_is_refused_then_rejects(
        prefect_ui, settings, family, page, screenshots, store):
    from lineage.aliases import registered_model
    from lineage.store.tracking import local_tracking

    before = registered_model.aliases(local_tracking(store / "store"), family)
    thread, result = _rollout_in_background(settings)
    run_id = _paused_run_id("shadow->canary", result)
    dialog = _open_form(page, prefect_ui, run_id, "shadow->canary")
    # spaces pass the browser's own check (length >= 1) and Prefect says "resumed"
    _answer(page, dialog, decision="approve", approver="   ", comment="looks fine",
            screenshot=screenshots / "prefect-blank-approver.png")
    run_id = _paused_run_id("shadow->canary", result, attempt=1)  # asked again
    dialog = _open_form(page, prefect_ui, run_id, "shadow->canary")
    # what the release manager sees: the re-asked form says which answer and why
    # the notice's bold start; its parent holds the whole sentence
    notice = dialog.get_by_text("Your answer was not accepted", exact=False).first.locator("xpath=..")
    notice.wait_for()
    assert re.search(r"approver: must not be blank", notice.inner_text()), notice.inner_text()
    page.screenshot(path=str(screenshots / "prefect-refused-answer.png"))
    _answer(page, dialog, decision="reject", approver="rm@example.com", comment="not this week",
            screenshot=screenshots / "prefect-rejection-form.png")
    thread.join(timeout=900)
    assert "error" not in result, result.get("error")
    state = result["state"]
    assert state.name == "Rejected", state.message  # a person said no: not RolledBack
    assert result["outcome"].stage == "approval" and "rm@example.com" in state.message
    after = registered_model.aliases(local_tracking(store / "store"), family)
    assert after.get("production") == before.get("production")
    _final_state_shown(page, prefect_ui, run_id, "Rejected",
                       screenshots / "prefect-rejected.png")


@pytest.fixture
def mlflow_ui(store):
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "flows.cli", "ui", "--store-dir",
                           str(store / "store"), "--port", str(port)], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}"
    finally:
        ui.send_signal(15)
        ui.wait(timeout=30)


def _dismiss_announcement(page) -> None:
    """Close MLflow 3's "new Model Registry UI" announcement, a modal that blocks every
    click on the registry page the first time it opens (README says so too)."""
    dialog = page.locator("div[role=dialog].du-bois-light-modal-wrap, div[role=dialog]").first
    try:
        dialog.wait_for(state="visible", timeout=10_000)
    except Exception:  # noqa: BLE001 - no announcement this time
        return
    page.keyboard.press("Escape")
    try:
        dialog.wait_for(state="hidden", timeout=3_000)
    except Exception:  # noqa: BLE001 - Escape did not close it: its own buttons do
        dialog.get_by_role("button").filter(
            has_text=re.compile("close|got it|dismiss|ok", re.I)).or_(
            dialog.get_by_role("button", name=re.compile("close", re.I))).first.click()
        dialog.wait_for(state="hidden", timeout=10_000)


def _click_past_announcement(page, link) -> None:
    """Click ``link`` on the registry page, closing the announcement first: it shows once
    the page has rendered, which on a loaded machine can be well after the link shows."""
    link.wait_for()
    for _ in range(6):
        _dismiss_announcement(page)
        try:
            link.click(timeout=10_000)
            return
        except Exception:  # noqa: BLE001 - the announcement came up meanwhile: again
            continue
    link.click()  # fails saying what blocks it


def _no_genai(page, visited: list[str]) -> None:
    """Fail when this page or any address visited so far is a GenAI view (by address, or
    by the "Evaluations" breadcrumb MLflow 3 puts over runs opened in GenAI mode)."""
    genai = [url for url in [*visited, page.url] if GENAI.search(url.split("#", 1)[-1])]
    assert not genai, f"a GenAI page on the auditor's path: {genai}"
    assert page.get_by_text("Evaluations", exact=True).count() == 0, page.url


def test_auditor_goes_from_the_home_page_to_production_its_caveat_and_its_chain(
        store, family, mlflow_ui, page, screenshots):
    from lineage.aliases import registered_model
    from lineage.store import tags
    from lineage.store.tracking import local_tracking

    tracking = local_tracking(store / "store")
    version = registered_model.alias_version(tracking, family, "production")
    if version is None:
        pytest.fail("no production version: the approval test must run first")
    name = registered_model.registered_model_name(family)
    visited: list[str] = []
    page.on("framenavigated", lambda f: visited.append(f.url) if f == page.main_frame else None)
    # the README's path, from the home page: MLflow 3 opens in GenAI mode, whose sidebar
    # has no Model registry; the sidebar's toggle switches to Model training
    page.goto(f"{mlflow_ui}/", wait_until="domcontentloaded")
    registry_link = page.get_by_role("link", name="Model registry", exact=True)
    page.get_by_text("Model training", exact=True).first.click()
    registry_link.first.click()
    page.wait_for_url(re.compile(r".*#/models(\?.*)?$"))
    _click_past_announcement(page, page.get_by_role("link", name=name, exact=True).first)
    _no_genai(page, visited)
    page.get_by_role("link", name=f"Version {version}", exact=True).first.click()
    page.wait_for_url(re.compile(rf".*/models/{name}/versions/{version}(\?.*)?$"))
    page.get_by_text("Chain of evidence", exact=False).first.wait_for(timeout=60_000)
    _no_genai(page, visited)
    from lineage.aliases.production_story import STORY_END

    recorded = tracking.client().get_model_version(name, version).description or ""
    story, _, rest = recorded.partition(STORY_END)
    # the page starts with where the version stands (the signed production story), shown
    # as text (its markers are HTML comments, not shown)
    assert "**In production since " in story, recorded
    page.get_by_text(re.compile(r"In production since .*\(promoted\)")).first.wait_for()
    assert page.get_by_text("kernelgate:production-story").count() == 0
    verdict = rest.strip().splitlines()[0]
    # the caveat rides in the verdict line (the profile's canary is too small for its
    # latency test's power), and the page shows that line as recorded
    assert verdict.lstrip("*# ").startswith("promoted") and "not assessed" in verdict, verdict
    shown = page.get_by_text(re.compile(r"^\W*promoted.*not assessed")).first
    shown.wait_for()
    assert "latency" in shown.inner_text(), shown.inner_text()
    page.screenshot(path=str(screenshots / "mlflow-production-version.png"))
    page.screenshot(path=str(screenshots / "mlflow-production-version-full.png"), full_page=True)
    vtags = registered_model.version_tags(tracking, family, version)
    expected = {vtags[tags.BUILD_RUN_ID], vtags[tags.EVALUATION_RUN_ID],
                vtags[tags.DECISION_RUN_ID], vtags[tags.SHADOW_RUN_ID],
                vtags[tags.CONFIRMATION_RUN_ID], vtags[tags.ROLLOUT_RUN_ID],
                *[v for k, v in vtags.items() if k.startswith(tags.APPROVAL_RUN_ID + ".")]}
    assert sum(k.startswith(tags.APPROVAL_RUN_ID + ".") for k in vtags) == 2  # both answers
    hrefs = page.locator("a[href*='/runs/']").evaluate_all("els => els.map(e => e.href)")
    # The description's links carry the model-training view (MLflow's own "source run"
    # link on the page does not, and is not ours): every run of the chain is linked so.
    ours = [h for h in hrefs if tags.UI_VIEW_QUERY in h]
    linked = {h.rstrip("/").rsplit("/runs/", 1)[1].split("?")[0].split("/")[0] for h in ours}
    assert expected <= linked, expected - linked
    for run_id in sorted(expected):
        href = next(h for h in ours if run_id in h)
        page.goto(href, wait_until="domcontentloaded")  # what clicking the link opens
        run = tracking.client().get_run(run_id)
        page.get_by_text(run.info.run_name, exact=False).first.wait_for(timeout=60_000)
        _no_genai(page, visited)
    page.screenshot(path=str(screenshots / "mlflow-linked-run.png"), full_page=True)


STAGING = ROOT / "thresholds" / "staging.yaml"
KERNELGATE = Path(sys.executable).parent / "kernelgate"


def _kernelgate_in_background(prefect_ui: str, *args: str):
    """``kernelgate ARGS`` as README's user runs it, reporting to this test's Prefect
    server: the process, a dict that gets ``error`` once it exits (what
    :func:`_paused_run_id` reports if that is before an approval is asked) and its output
    lines, complete once ``error`` is there."""
    env = dict(os.environ, PREFECT_API_URL=f"{prefect_ui}/api")
    process = subprocess.Popen([str(KERNELGATE), *args], cwd=ROOT, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    result: dict = {}
    lines: list[str] = []

    def read():
        lines.extend(process.stdout)
        result["error"] = f"kernelgate {args[0]} exited {process.wait()}: {''.join(lines[-20:])}"
    threading.Thread(target=read, daemon=True).start()
    return process, result, lines


def _ended(process, result: dict, lines: list[str], timeout_s: float = 900) -> str:
    """The command's whole output once it exited 0 (README: every signed end but an
    errored one exits 0)."""
    assert process.wait(timeout=timeout_s) == 0, "".join(lines[-40:])
    deadline = time.monotonic() + 30
    while "error" not in result and time.monotonic() < deadline:
        time.sleep(0.1)
    return "".join(lines)


LATENCY_ROLLBACK = re.compile(r"^\* reason: canary[-\w]*: latency: candidate slower "
                              r"(than production \(signed-rank|at canary)[^;\n]*$", re.M)
"""The rollout's closing reason when the canary's signed-rank latency test alone rolled it
back (``gates.canary`` at a step, ``gates.latency_judge`` over the canary)."""


def _approved_at_both_transitions(prefect_ui: str, page, screenshots: Path,
                                  command: list[str]) -> tuple[str | None, str]:
    """``kernelgate ROLLOUT`` approved in the UI at shadow->canary and at
    canary->production: ``(the flow run's id, the whole output)``, or ``(None, output)``
    when the canary's latency judge rolled it back before the second ask (exit 0). Any
    other end before an ask fails the test."""
    process, result, lines = _kernelgate_in_background(prefect_ui, *command)
    for transition, shot in (("shadow->canary", "staging-shadow-form.png"),
                             ("canary->production", "staging-production-form.png")):
        try:
            run_id = _paused_run_id(transition, result)
        except AssertionError:
            if transition != "canary->production":
                raise
            out = _ended(process, result, lines)
            if not LATENCY_ROLLBACK.search(out):
                raise
            return None, out
        dialog = _open_form(page, prefect_ui, run_id, transition)
        _answer(page, dialog, decision="approve", approver="rm@example.com",
                comment="evidence read; go", screenshot=screenshots / shot)
    return run_id, _ended(process, result, lines)


def test_walkthrough_under_staging_from_an_empty_store_rejects_one_rollout_and_promotes_one(
        prefect_ui, family, page, screenshots, tmp_path):
    """README's release-manager walkthrough as written, from an empty store, under the
    shipped ``thresholds/staging.yaml`` at its own sizes (the CLI's defaults: no
    tests-only profile, no smaller settings): ``kernelgate calibrate`` (one A/A canary:
    with no production yet, the native baseline against itself, for the family
    ``--implementation native`` rolls out), then ``kernelgate rollout --implementation
    native --thresholds thresholds/staging.yaml`` twice, answered in the Prefect UI:
    rejected at shadow->canary (*Rejected*, Failed-type, exit 0, no production), then
    approved at both transitions (*Promoted*, exit 0, in production; rolled out once more
    if the canary's latency test rolled the identical kernel back, at its alpha).

    The rejection comes first so that neither gate compares speed with a production
    version: an identical kernel's p99 against production's on a busy 2-core host is
    noise this test is not about (each gate here judges the candidate against naive)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType

    from lineage.aliases import registered_model
    from lineage.store.tracking import local_tracking

    def calibrate(store: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(KERNELGATE), "calibrate", "--thresholds", str(STAGING), "--runs", "1",
             "--store-dir", str(store)], cwd=ROOT, capture_output=True, text=True, timeout=600)

    store = tmp_path / "store"
    calibrated = calibrate(store)
    if calibrated.returncode == 1:
        # The one A/A canary rolled back: an identical kernel is, with probability alpha
        # (0.01; seen once in CI on a loaded host). The store's calibrations pool, so only
        # some 19 more runs would vouch again: this walkthrough starts over on an empty
        # store instead (the pooling is tests/test_lineage_calibration.py's).
        assert "the canary on this device counts none" in calibrated.stdout, calibrated.stdout
        store = tmp_path / "store-again"
        calibrated = calibrate(store)
    assert calibrated.returncode == 0, calibrated.stdout + calibrated.stderr
    assert f"calibrating family {family}" in calibrated.stderr, calibrated.stderr
    assert "A/A canaries rolled back" in calibrated.stdout, calibrated.stdout
    command = ["rollout", "--implementation", "native", "--thresholds", str(STAGING),
               "--store-dir", str(store)]

    process, result, lines = _kernelgate_in_background(prefect_ui, *command)
    run_id = _paused_run_id("shadow->canary", result)
    dialog = _open_form(page, prefect_ui, run_id, "shadow->canary")
    _answer(page, dialog, decision="reject", approver="rm@example.com",
            comment="not this release", screenshot=screenshots / "staging-rejection-form.png")
    out = _ended(process, result, lines)
    assert "— rejected at approval" in out and "rm@example.com" in out, out[-3000:]
    assert registered_model.alias_version(local_tracking(store), family, "production") is None
    _final_state_shown(page, prefect_ui, run_id, "Rejected", screenshots / "staging-rejected.png")
    with get_client(sync_client=True) as client:  # red in the runs list, not green
        assert client.read_flow_run(run_id).state.type == StateType.FAILED

    run_id, out = _approved_at_both_transitions(prefect_ui, page, screenshots, command)
    if run_id is None:
        # The canary's latency judge rolled back an identical kernel (the native baseline
        # against itself): it may, with probability <= its alpha (0.01; seen once in CI).
        # Not what this walkthrough is about, so it rolls out once more: a judge with no
        # bias does that twice in 1e-4 walkthroughs, and a biased one would fail again.
        assert registered_model.alias_version(local_tracking(store), family,
                                              "production") is None
        warnings.warn("the staging walkthrough's canary rolled the identical kernel back for "
                      f"latency; rolled out once more: {LATENCY_ROLLBACK.search(out)[0]}",
                      stacklevel=1)
        run_id, out = _approved_at_both_transitions(prefect_ui, page, screenshots, command)
    assert run_id is not None, out[-3000:]
    production = registered_model.alias_version(local_tracking(store), family, "production")
    assert production is not None and f"{family} v{production} — promoted" in out, out[-3000:]
    _final_state_shown(page, prefect_ui, run_id, "Promoted", screenshots / "staging-promoted.png")
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run_id).state.type == StateType.COMPLETED
