"""The real pair in the browser: the Models tab composes Gemma 3 270M + SmolLM2-135M-Instruct and Chat answers
with the composition. Skipped when the pair is not prepared (python -m calm_core.models.real_pair) or there is no
Chromium; .ci/run prepares the pair."""
from __future__ import annotations

import re

import pytest

from calm_core.models.real_pair import cache_dir, prepared_pair

from .app_server import serve
from .test_app_browser import TIMEOUT_MS, block, browser, expect, shot, table  # noqa: F401 (browser: a fixture)

if prepared_pair() is None:
    pytest.skip("the real pair is not prepared: python -m calm_core.models.real_pair", allow_module_level=True)


@pytest.fixture(scope="module")
def real_url(tmp_path_factory):
    yield from serve(tmp_path_factory, real_pair_dir=cache_dir())


def test_the_real_pair_composes_and_answers(browser, real_url):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(real_url)
    expect(table(page, "Models").get_by_role("gridcell", name="anchor", exact=True)).to_be_visible()  # the preset
    page.get_by_role("button", name=re.compile(r"^Compose the real pair")).click()
    models = table(page, "Models")
    expect(models.get_by_role("gridcell", name="Gemma3ForCausalLM", exact=True)).to_be_visible()
    expect(models.get_by_role("gridcell", name="LlamaForCausalLM", exact=True)).to_be_visible()
    expect(page.get_by_text(re.compile(r"\d+ composition layers")).first).to_be_visible()
    shot(page, "app-real-pair-models")

    page.get_by_role("tab", name="3 · Chat").click()
    page.get_by_text("Sampling").click()
    page.get_by_label("number input for max new tokens").fill("6")  # three real models answer: keep it short
    page.get_by_label("number input for max new tokens").press("Tab")
    page.get_by_label("Prompt", exact=True).fill("The capital of France is")
    page.get_by_role("button", name="Send", exact=True).click()
    chats = page.get_by_role("log")
    expect(chats).to_have_count(3)
    composed = block(page, "CALM (composed)").get_by_test_id("bot")
    expect(composed).to_have_count(1)
    expect(composed).not_to_have_text("")
    expect(page.get_by_text(re.compile(r"tokens/s"))).to_be_visible()
    shot(page, "app-real-pair-chat")
    context.close()
