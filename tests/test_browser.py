"""What a release manager and an auditor see, in a real browser (headless Chromium,
driven by Playwright): a paused rollout approved and one rejected through the Prefect
UI's form, and the auditor's path in the MLflow UI from the registered model to the
version behind ``production`` to each run its description links.

Needs ``/usr/bin/chromium`` (Debian's ``chromium``; ``.ci/run`` installs it) and the
``playwright`` package (dev extra). Run with ``make test-browser``. Screenshots go to
``$KERNELGATE_SCREENSHOTS`` (default ``<pytest tmp>/screenshots``).
"""

from __future__ import annotations

import contextvars
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from kernels.shapes import AttentionShape
from tests import faulty_kernels
from tests.faulty_kernels import Fault

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).parents[1]
FAMILY = "attention-browser"
THRESHOLDS = Path(__file__).parent / "data" / "thresholds-flow-test.yaml"
SMALL_SHAPE = [AttentionShape(batch=1, q_len=128, kv_len=128, num_heads=4, num_kv_heads=4,
                              head_dim=32, dtype="float32", causal=False)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
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
    port = _free_port()
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
    from evaluation.testset import build_testset

    root = tmp_path_factory.mktemp("browser-store")
    build_testset(root / "testset", profile="ci")
    thresholds = yaml.safe_load(THRESHOLDS.read_text())
    thresholds["approval"].update(required_for=["shadow->canary"], timeout_s=600)
    (root / "thresholds.yaml").write_text(yaml.safe_dump(thresholds))
    return root


@pytest.fixture
def settings(store, monkeypatch):
    from flows.settings import RolloutSettings

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    faulty_kernels.register(monkeypatch)
    monkeypatch.setattr(Fault, "active", False)
    return RolloutSettings(implementation="test_good", family=FAMILY,
                           thresholds=store / "thresholds.yaml", testset_dir=store / "testset",
                           store_dir=store / "store", shadow_requests=8, perf_repeats=3,
                           perf_shapes=SMALL_SHAPE, model_check=False)


def _paused_run_id(transition: str, result: dict, timeout_s: float = 900) -> str:
    """The flow run that waits for ``transition``'s approval, once its form exists."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    from flows import promotion

    schema_key = f"paused-{promotion.pause_key(transition, 0)}-schema"
    paused = FlowRunFilter(state=FlowRunFilterState(
        type=FlowRunFilterStateType(any_=[StateType.PAUSED])))
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            if "error" in result:
                raise AssertionError(f"the rollout failed: {result['error']!r}")
            for run in client.read_flow_runs(flow_run_filter=paused):
                try:
                    client.read_flow_run_input(flow_run_id=run.id, key=schema_key)
                except Exception:  # noqa: BLE001 - paused, but the form is not saved yet
                    continue
                return str(run.id)
            time.sleep(0.5)
    raise AssertionError("the rollout never paused for approval")


def _rollout_in_background(settings):
    from flows.rollout import rollout

    result: dict = {}

    def run():
        try:
            result["state"] = rollout(settings, return_state=True)
            result["outcome"] = result["state"].result()  # here: no event loop in this thread
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


def _answer_in_ui(page, base: str, run_id: str, *, approve: bool, comment: str,
                  screenshot: Path) -> None:
    """Open the paused run, click *Resume*, fill the form, submit."""
    page.goto(f"{base}/runs/flow-run/{run_id}")
    page.get_by_role("button", name="Resume").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Approve `shadow->canary`", exact=False).or_(
        dialog.get_by_text("Approve shadow->canary", exact=False)).first.wait_for()
    # the decision is a required choice (an enum: Prefect's form renders its p-select, a
    # button that opens a list of role=option entries; it starts empty)
    _choose(page, dialog.locator(".p-select-button__control").first,
            "approve" if approve else "reject")
    boxes = dialog.locator("textarea")
    boxes.nth(0).fill("rm@example.com")
    boxes.nth(1).fill(comment)
    dialog.get_by_role("heading", name=re.compile("Approve")).first.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot))
    dialog.get_by_role("button", name="Submit").click()


def _final_state_shown(page, base: str, run_id: str, name: str, screenshot: Path) -> None:
    page.goto(f"{base}/runs/flow-run/{run_id}")
    page.get_by_text(name, exact=True).first.wait_for(timeout=60_000)
    page.screenshot(path=str(screenshot))


def test_release_manager_approves_in_the_form_and_the_rollout_is_promoted(
        prefect_ui, settings, page, screenshots, store):
    from lineage import registered_model
    from lineage.tracking import local_tracking

    thread, result = _rollout_in_background(settings)
    run_id = _paused_run_id("shadow->canary", result)
    page.goto(f"{prefect_ui}/runs/flow-run/{run_id}")
    _answer_in_ui(page, prefect_ui, run_id, approve=True, comment="evidence read; go",
                  screenshot=screenshots / "prefect-approval-form.png")
    thread.join(timeout=900)
    assert "error" not in result, result.get("error")
    state = result["state"]
    assert state.name == "Promoted", state.message
    outcome = result["outcome"]
    assert registered_model.alias_version(local_tracking(store / "store"), FAMILY,
                                  "production") == outcome.version
    _final_state_shown(page, prefect_ui, run_id, "Promoted", screenshots / "prefect-promoted.png")


def test_release_manager_rejects_in_the_form_and_the_rollout_rolls_back(
        prefect_ui, settings, page, screenshots, store):
    from lineage import registered_model
    from lineage.tracking import local_tracking

    before = registered_model.aliases(local_tracking(store / "store"), FAMILY)
    thread, result = _rollout_in_background(settings)
    run_id = _paused_run_id("shadow->canary", result)
    _answer_in_ui(page, prefect_ui, run_id, approve=False, comment="not this week",
                  screenshot=screenshots / "prefect-rejection-form.png")
    thread.join(timeout=900)
    assert "error" not in result, result.get("error")
    state = result["state"]
    assert state.name == "Rejected", state.message  # a person said no: not RolledBack
    assert result["outcome"].stage == "approval" and "rm@example.com" in state.message
    after = registered_model.aliases(local_tracking(store / "store"), FAMILY)
    assert after.get("production") == before.get("production")
    _final_state_shown(page, prefect_ui, run_id, "Rejected",
                       screenshots / "prefect-rejected.png")


@pytest.fixture
def mlflow_ui(store):
    port = _free_port()
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


def test_auditor_follows_production_to_every_linked_run(store, mlflow_ui, page, screenshots):
    from lineage import registered_model, tags
    from lineage.tracking import local_tracking

    tracking = local_tracking(store / "store")
    version = registered_model.alias_version(tracking, FAMILY, "production")
    if version is None:
        pytest.fail("no production version: the approval test must run first")
    name = registered_model.registered_model_name(FAMILY)
    # the README's path: the registry in MLflow 3's model-training view (the UI's default
    # is GenAI, which has no Models entry)
    page.goto(f"{mlflow_ui}/#/models?{tags.UI_VIEW_QUERY}", wait_until="domcontentloaded")
    _dismiss_announcement(page)
    page.get_by_role("link", name=name, exact=True).first.click()
    page.get_by_role("link", name=f"Version {version}", exact=True).first.click()
    page.wait_for_url(re.compile(rf".*/models/{name}/versions/{version}(\?.*)?$"))
    description = page.get_by_text("Chain of evidence", exact=False).first
    description.wait_for(timeout=60_000)
    page.get_by_text("promoted", exact=False).first.wait_for()
    recorded = tracking.client().get_model_version(name, version).description or ""
    if "not assessed" in recorded.splitlines()[0]:  # the caveat rides in the verdict line
        page.get_by_text("not assessed", exact=False).first.wait_for()
    page.screenshot(path=str(screenshots / "mlflow-production-version.png"), full_page=True)
    vtags = registered_model.version_tags(tracking, FAMILY, version)
    expected = {vtags[tags.BUILD_RUN_ID], vtags[tags.EVALUATION_RUN_ID],
                vtags[tags.DECISION_RUN_ID], vtags[tags.SHADOW_RUN_ID],
                vtags[tags.CONFIRMATION_RUN_ID], vtags[tags.ROLLOUT_RUN_ID],
                *[v for k, v in vtags.items() if k.startswith(tags.APPROVAL_RUN_ID + ".")]}
    hrefs = page.locator("a[href*='/runs/']").evaluate_all("els => els.map(e => e.href)")
    # The description's links carry the model-training view (MLflow's own "source run"
    # link on the page does not, and is not ours): every run of the chain is linked so.
    ours = [h for h in hrefs if tags.UI_VIEW_QUERY in h]
    linked = {h.rstrip("/").rsplit("/runs/", 1)[1].split("?")[0].split("/")[0] for h in ours}
    assert expected <= linked, expected - linked
    for run_id in sorted(expected):
        href = next(h for h in ours if run_id in h)
        page.goto(href, wait_until="domcontentloaded")
        run = tracking.client().get_run(run_id)
        page.get_by_text(run.info.run_name, exact=False).first.wait_for(timeout=60_000)
        assert page.get_by_text("Evaluations", exact=True).count() == 0, href  # no GenAI page
    page.screenshot(path=str(screenshots / "mlflow-linked-run.png"), full_page=True)
