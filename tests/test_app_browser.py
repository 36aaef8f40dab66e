"""The app's main path in headless Chromium (Playwright), against app.py served over a tiny preset.

Needs the `playwright` Python package and a system Chromium at /usr/bin/chromium (Debian:
`apt-get install chromium`); the module is skipped without them. Screenshots of each stage go to
test-artifacts/ at the repository root."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
TIMEOUT_MS = 60_000  # the CPU is shared and busy

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"no Chromium at {CHROMIUM}", allow_module_level=True)
expect = sync_api.expect
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        except sync_api.Error as exc:
            pytest.skip(f"Chromium does not start: {exc}")
        yield browser
        browser.close()


@pytest.fixture
def page(browser, app_url):  # noqa: F811
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(app_url)
    yield page
    context.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def block(page, label: str):
    """The component block whose label reads exactly `label`."""
    title = page.get_by_test_id("block-label").filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))
    return title.locator("xpath=..")


def table(page, label: str):
    """A Dataframe by its label (Dataframes draw their label inside the table container)."""
    title = page.locator(".label").filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))
    return page.locator(".table-container").filter(has=title)


def plot(page, label: str):
    return block(page, label).locator(".js-plotly-plot")


def evaluate_three(page, *metrics: str):
    """Evaluate the preset's held-out set on three examples (ticking `metrics` too); the Results table, once it
    holds the CALM row."""
    page.get_by_role("tab", name="5 · Evaluate").click()
    for metric in metrics:
        page.get_by_role("checkbox", name=metric, exact=True).check()
    page.get_by_label("examples (0 = all)").fill("3")
    page.get_by_role("button", name="Evaluate", exact=True).click()
    results = table(page, "Results")
    expect(results.get_by_role("gridcell", name="CALM", exact=True)).to_be_visible()
    return results


def test_main_path(page):
    # 1 · Models: the page's load event composes the default preset
    models = table(page, "Models")
    for role in ("anchor", "augment 0", "bridge"):
        expect(models.get_by_role("gridcell", name=role, exact=True)).to_be_visible()
    expect(page.get_by_text(re.compile(r"trainable parameters"))).to_be_visible()
    expect(plot(page, "Composition layers")).to_be_visible()
    shot(page, "app-1-models")

    # 2 · Data & train
    page.get_by_role("tab", name="2 · Data & train").click()
    expect(page.get_by_text(re.compile(r"40 training and 10 validation examples"))).to_be_visible()
    page.get_by_label("steps").fill("20")
    page.get_by_label("batch size").fill("4")
    page.get_by_role("button", name="Train", exact=True).click()
    expect(page.get_by_text(re.compile(r"Step \d+/20"))).to_be_visible()  # the status updates while it runs
    expect(page.get_by_text(re.compile(r"Step 20/20 · loss \d"))).to_be_visible()
    expect(page.get_by_text("Finished 20 steps.")).to_be_visible()
    expect(plot(page, "Loss")).to_be_visible()
    expect(plot(page, "Loss").locator(".scatterlayer .trace")).not_to_have_count(0)
    expect(plot(page, "Gates")).to_be_visible()
    shot(page, "app-2-train")

    # 3 · Chat: an empty prompt is refused with a message; a prompt gets three answers
    page.get_by_role("tab", name="3 · Chat").click()
    send = page.get_by_role("button", name="Send", exact=True)
    send.click()
    toast = page.get_by_test_id("toast-body").filter(has_text="Type a prompt first.")
    expect(toast).to_be_visible()
    toast.get_by_test_id("toast-close").click()
    expect(toast).to_have_count(0)
    page.get_by_label("Prompt", exact=True).fill("abcd=")
    send.click()
    chats = page.get_by_role("log")
    expect(chats).to_have_count(3)
    for label in ("CALM (composed)", "anchor alone", "augmenting model alone"):
        expect(page.get_by_test_id("block-label").filter(has_text=label)).to_be_visible()
    for i in range(3):
        expect(chats.nth(i).get_by_test_id("user")).to_have_text("abcd=")
        expect(chats.nth(i).get_by_test_id("bot")).to_have_count(1)
        expect(chats.nth(i).get_by_test_id("bot")).not_to_have_text("")
    # a prompt sent while a reply is still pending runs once it has ended, on the histories as they are then
    page.get_by_label("Prompt", exact=True).fill("fed=")
    send.click()
    page.get_by_label("Prompt", exact=True).fill("cba=")
    page.get_by_label("Prompt", exact=True).press("Enter")
    for i in range(3):
        expect(chats.nth(i).get_by_test_id("user")).to_have_text(["abcd=", "fed=", "cba="])
        expect(chats.nth(i).get_by_test_id("bot")).to_have_count(3)
    shot(page, "app-3-chat")

    # 4 · Inside the bridge
    page.get_by_role("tab", name="4 · Inside the bridge").click()
    page.get_by_role("button", name="Show gates").click()
    for label in ("Gate opening", "Over training", "Layer × channel"):
        expect(plot(page, label)).to_be_visible()
    page.get_by_label("Text to look at (both models read it)").fill("abcd=dcba")
    expect(page.get_by_role("radio", name="text", exact=True)).to_be_checked()  # the tiny preset writes completions
    page.get_by_role("button", name="Show cross-attention").click()
    expect(plot(page, "Cross-attention")).to_be_visible()
    page.get_by_role("radio", name="chat question").check()  # the same text in the chat wrapping: a longer map
    page.get_by_role("button", name="Show cross-attention").click()
    expect(plot(page, "Cross-attention")).to_be_visible()
    shot(page, "app-4-bridge")

    # 5 · Evaluate: the preset's held-out set, three examples
    results = evaluate_three(page)
    expect(results.get_by_role("gridcell", name=re.compile(r"^anchor: "))).to_be_visible()
    expect(results.get_by_role("gridcell", name=re.compile(r"^augment 0: "))).to_be_visible()
    expect(results.get_by_role("columnheader", name="exact_match")).to_be_visible()
    shot(page, "app-5-evaluate")


def test_a_baseline_trains_and_joins_the_comparison(page):
    """The paper's comparison in the page: LoRA on the anchor, trained on the same data with the bridge's parameter
    count, then a row of its own in Evaluate beside the composition."""
    expect(table(page, "Models").get_by_role("gridcell", name="bridge", exact=True)).to_be_visible()
    page.get_by_role("tab", name="2 · Data & train").click()
    expect(page.get_by_text(re.compile(r"40 training and 10 validation examples"))).to_be_visible()
    page.get_by_role("radio", name="baseline: LoRA on the anchor").check()
    page.get_by_label("steps").fill("5")
    page.get_by_label("batch size").fill("4")
    page.get_by_role("button", name="Train", exact=True).click()
    expect(page.get_by_text(re.compile(r"The baseline is ready: anchor \+ LoRA \([\d,]+ trained; bridge [\d,]+\)"))).to_be_visible()
    results = evaluate_three(page, "forgetting")
    expect(results.get_by_role("gridcell", name=re.compile(r"^anchor \+ LoRA \("))).to_be_visible()
    expect(results.get_by_role("columnheader", name="forgetting: expected words")).to_be_visible()
    expect(plot(page, "The table as bars: one panel per metric, one bar per model")).to_be_visible()
    shot(page, "app-7-baseline")
    # 3 · Chat: the baseline as a fourth column, answering the same prompt beside the three
    page.get_by_role("tab", name="3 · Chat").click()
    page.get_by_label("fourth column: a baseline").click()
    page.get_by_role("option", name=re.compile(r"^anchor \+ LoRA \(")).click()
    expect(page.get_by_test_id("block-label").filter(has_text=re.compile(r"^\s*anchor \+ LoRA\s*$"))).to_be_visible()
    page.get_by_label("Prompt", exact=True).fill("abcd=")
    page.get_by_role("button", name="Send", exact=True).click()
    chats = page.get_by_role("log")
    expect(chats).to_have_count(4)
    for i in range(4):
        expect(chats.nth(i).get_by_test_id("user")).to_have_text("abcd=")
        expect(chats.nth(i).get_by_test_id("bot")).not_to_have_text("")
    expect(page.get_by_text(re.compile(r"tokens/s over the 4 models"))).to_be_visible()
    shot(page, "app-8-baseline-chat")


def toast(page, text: str):
    """Wait for an error message containing `text`, then close it."""
    body = page.get_by_test_id("toast-body").filter(has_text=text)
    expect(body.first).to_be_visible()
    body.first.get_by_test_id("toast-close").click()


def test_classroom_safeguards(page):
    """Issue 19's broken items as a student meets them: each is refused with its range, and the page
    shows the preset's own settings and only the heads the bridge has."""
    expect(table(page, "Models").get_by_role("gridcell", name="bridge", exact=True)).to_be_visible()
    expect(page.get_by_text("random tiny models")).to_be_visible()  # the preset's story

    page.get_by_role("tab", name="2 · Data & train").click()
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(page.get_by_text("Nothing is training.")).to_be_visible()
    page.get_by_label("batch size").fill("100000")
    page.get_by_role("button", name="Train", exact=True).click()
    toast(page, "batch size must be a whole number from 1 to 4,096")
    page.get_by_label("batch size").fill("4")
    page.get_by_label("learning rate", exact=True).fill("1000000")
    page.get_by_role("button", name="Train", exact=True).click()
    toast(page, "learning rate must be a number above 0 up to 10")
    shot(page, "app-6-refused")

    page.get_by_role("tab", name="3 · Chat").click()
    page.get_by_text("Sampling").click()
    expect(page.get_by_label("number input for max new tokens")).to_have_value("6")  # the preset's max_new_tokens

    page.get_by_role("tab", name="4 · Inside the bridge").click()
    page.get_by_label("head").click()
    options = page.get_by_role("option")
    expect(options).to_have_count(5)  # mean and the bridge's 4 heads
    expect(options.filter(has_text=re.compile(r"^\s*10\s*$"))).to_have_count(0)
    page.keyboard.press("Escape")
    page.get_by_label("Text to look at (both models read it)").fill("abcd" * 1250)
    page.get_by_role("button", name="Show cross-attention").click()
    toast(page, "a cross-attention map shows at most")


def status(page, *parts: str):
    """The status block (Markdown) that holds every one of `parts` (regular expressions)."""
    found = page.locator(".prose")
    for part in parts:
        found = found.filter(has_text=re.compile(part))
    return found.last


def test_the_experiments_loop(page, tmp_path):
    """Start over, train two runs (the held-out accuracy curve drawn while they train), compare them in the Runs tab,
    export one's settings, load them back into the Train tab, stop a third run and resume it, download a run."""
    expect(table(page, "Models").get_by_role("gridcell", name="bridge", exact=True)).to_be_visible()
    page.get_by_role("button", name="Start over with a closed bridge").click()
    expect(page.get_by_text(re.compile(r"closed|anchor exactly", re.I)).first).to_be_visible()
    page.get_by_role("tab", name="2 · Data & train").click()
    expect(page.get_by_text(re.compile(r"40 training and 10 validation examples"))).to_be_visible()
    train = page.get_by_role("button", name="Train", exact=True)
    accuracy = "Held-out exact match"
    for name, lr in (("slow", "0.002"), ("fast", "0.02")):
        page.get_by_label("run name (the Runs tab keeps every run)").fill(name)
        page.get_by_label("steps").fill("12")
        page.get_by_label("batch size").fill("4")
        page.get_by_label("learning rate", exact=True).fill(lr)
        train.click()
        expect(status(page, rf"^Step 12/12 · loss .* · run-00{1 + (name == 'fast')}", "Finished 12 steps.")).to_be_visible()
        expect(page.get_by_text(re.compile(r"held-out exact match [\d.]+% on 10 validation examples"))).to_be_visible()
        expect(plot(page, accuracy).locator(".scatterlayer .trace")).not_to_have_count(0)
    shot(page, "app-9-train-accuracy")

    page.get_by_role("tab", name="6 · Runs").click()
    page.get_by_role("checkbox", name=re.compile(r"^run-001 · slow")).check()
    page.get_by_role("checkbox", name=re.compile(r"^run-002 · fast")).check()
    expect(plot(page, "The ticked runs compared").locator(".scatterlayer .trace")).to_have_count(6)
    diff = table(page, "Settings that differ between the ticked runs")
    expect(diff.get_by_role("gridcell", name="lr", exact=True)).to_be_visible()
    expect(diff.get_by_role("gridcell", name="0.02", exact=True)).to_be_visible()
    shot(page, "app-10-runs-compared")

    page.get_by_role("checkbox", name=re.compile(r"^run-001 · slow")).uncheck()
    page.get_by_role("button", name="Export settings").click()
    expect(page.locator("label:has-text('The same run from the command line') textarea")).to_have_value(
        re.compile(r"^python -m calm_core train --anchor .* --lr 0\.02 .*--out runs/run-002$"))
    link = block(page, "Settings file").get_by_role("link").first
    expect(link).to_be_visible()
    settings = tmp_path / "run-002.yaml"
    settings.write_bytes(page.request.get(link.get_attribute("href")).body())
    assert "lr: 0.02" in settings.read_text()
    settings.write_text(settings.read_text().replace("steps: 12", "steps: 240"))  # long enough to be stopped

    page.get_by_role("tab", name="2 · Data & train").click()
    block(page, "Load settings (.yaml / .json from Runs)").locator(
        "input[type=file]").set_input_files(str(settings))
    expect(page.get_by_label("steps")).to_have_value("240")
    expect(page.get_by_label("learning rate", exact=True)).to_have_value("0.02")
    page.get_by_label("run name (the Runs tab keeps every run)").fill("to resume")
    train.click()
    expect(page.get_by_text(re.compile(r"Step [1-9]\d*/240"))).to_be_visible()
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(page.get_by_text(re.compile(r"Stopped at step \d+"))).to_be_visible()

    page.get_by_role("tab", name="6 · Runs").click()
    page.get_by_role("button", name="Refresh").click()
    for other in ("run-001", "run-002"):
        page.get_by_role("checkbox", name=re.compile(rf"^{other} ")).uncheck()
    page.get_by_role("checkbox", name=re.compile(r"^run-003 · to resume · stopped")).check()
    page.get_by_role("button", name="Resume training").click()
    expect(page.get_by_text(re.compile(r"Resuming run-003 from step \d+"))).to_be_visible()
    expect(page.get_by_text("Finished 240 steps.").last).to_be_visible(timeout=120_000)
    page.get_by_role("button", name="Refresh").click()  # the list as the run store holds it now
    expect(page.get_by_role("checkbox", name=re.compile(r"^run-003 · to resume · finished at step 240.240$"))).to_be_visible()
    page.get_by_role("button", name="Download run").click()
    expect(block(page, "Run folder (.zip)").get_by_role("link").first).to_be_visible()
    shot(page, "app-11-runs-resumed")
