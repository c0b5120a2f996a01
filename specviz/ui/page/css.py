"""The page's own CSS and script, added to the theme's."""

from specviz.views.charts import FIT_SCRIPT
from specviz.views.tokens import TIP_CSS, TIP_SCRIPT

# Touch screens have no hover: a tapped token (focusable) shows its details in a box under it,
# kept inside the window (specviz.views.tokens; the exported file uses the same).
CSS = TIP_CSS

# On a phone the Explanation's table of quantities gave its first column a few letters' width and
# broke the names into syllables ("dra ft acc ept anc e"): the names keep their words whole.
CSS += """
#sv-explain table td:first-child, #sv-explain table th:first-child {
  min-width: 7.5em; word-break: normal; overflow-wrap: normal; hyphens: manual;
}
"""

# The page's three columns (specviz.ui.page.layout): what to run, what it shows, the settings. On a wide
# screen a grid puts what it shows (output, stats and the tabs) on the right beside the other two
# (the tabs had started about 1,980 px down at 1920 x 1080 under an empty right column), and gives it
# two thirds of the width: at 1280 x 720 (a projector) its box is about 800 px, room for the replay's
# table (it was 670 px, for a 942 px table). Narrower, they stack in that order.
CSS += """
@media (min-width: 1100px) {
  #sv-main { display: grid !important; grid-template-columns: minmax(340px, 1fr) minmax(0, 2fr);
             grid-template-rows: auto 1fr; gap: var(--layout-gap); align-items: start; }
  #sv-main > #sv-run { grid-column: 1; grid-row: 1; min-width: 0; }
  #sv-main > #sv-settings { grid-column: 1; grid-row: 2; min-width: 0; }
  #sv-main > #sv-show { grid-column: 2; grid-row: 1 / span 2; min-width: 0; }
}
"""

# On a phone plotly's toolbar (the modebar) is always shown, not only on hover, and lay over the
# charts' titles; touch zooms and pans without it, so a narrow screen hides it.
CSS += """
@media (max-width: 700px) {
  #sv-main .modebar-container { display: none !important; }
}
"""

# The Theory tab's acceptance tables (specviz.views.tree_budget): captions read as titles, cells as
# counts, and a wide table scrolls inside its box on a phone.
CSS += """
#sv-rank-table .sv-rank-tables { overflow-x: auto; }
#sv-rank-table table.sv-rank-table {
  border-collapse: collapse; margin: 0.6em 0 1.2em; font-variant-numeric: tabular-nums;
}
#sv-rank-table table.sv-rank-table caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
#sv-rank-table table.sv-rank-table th, #sv-rank-table table.sv-rank-table td {
  border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; white-space: nowrap;
}
"""

# On a phone (390 x 844) the intro filled the first screen, and Generate sat at y = 1,075 and the headline at
# 1,350 under the pair's menu, its notes and the limits. There the run column's parts join the page's own column
# (display: contents) and are ordered: the prompt and Generate, then what the run shows (the headline first),
# then the pair, its notes, the limits and the example prompts, then the settings.
CSS += """
@media (max-width: 700px) {
  #sv-main { flex-direction: column; flex-wrap: nowrap; align-items: stretch; }
  #sv-main > #sv-run { display: contents; }
  #sv-run > * { order: 4; }
  #sv-run > .form:has(#sv-prompt) { order: 1; }
  #sv-run > #sv-buttons { order: 2; }
  #sv-main > #sv-show { order: 3; }
  #sv-main > #sv-settings { order: 5; }
  #sv-intro h1 { font-size: 1.5em; margin-bottom: 0.2em; }
}
"""

# Rules that go in the page's head as they are: Gradio scopes the CSS above to the app's content box (each selector
# under its container) and drops @container and @supports rules.
#
# A phone's side margins: 10 px instead of Gradio's 32 (the page's column was 326 px wide at 390).
HEAD_CSS = """
@media (max-width: 700px) {
  .gradio-container .main.app { padding-left: 10px !important; padding-right: 10px !important; }
}
"""

# The intro's paragraph sits in a <details> (specviz.ui.page.layout.intro_markdown): open where there is room for it,
# folded to its one line "How it works" on a phone and on a short screen (a projector's 1280 x 720, where the tabs
# started below the fold after a run). A browser without ::details-content keeps it folded, one click away.
HEAD_CSS += """
#sv-intro details.sv-intro > summary { cursor: pointer; color: var(--body-text-color-subdued); }
@supports selector(::details-content) {
  @media (min-width: 701px) and (min-height: 800px) {
    #sv-intro details.sv-intro::details-content { content-visibility: visible; display: block; }
    #sv-intro details.sv-intro > summary { display: none; }
  }
}
"""

# The replay's tables fit their box (specviz.views.replay.COLUMNS): at 1280 x 720 the drafts table was 942 px wide
# in a 670 px box, the verdict and u past its edge, and on a phone 276 px of it showed. The Replay tab is a size
# container; narrower than a wide screen its bars narrow (--sv-bar) and β folds, and on a phone q(x) and p(x) fold
# too (min(1, p/q) with u stays, the verdict beside it), with the columns of one drafter kind. The switch above the
# table (#sv-replay-all) shows every column, the table then scrolling sideways in its box; it shows only where a
# column folds.
HEAD_CSS += """
#sv-replay-tab { container: sv-replay / inline-size; }
@container sv-replay (min-width: 1000px) { #sv-replay-all { display: none !important; } }
@container sv-replay (max-width: 999px) {
  #sv-replay .sv-replay { --sv-bar: 100px; }
  #sv-replay .sv-col-beta { display: none; }
}
@container sv-replay (max-width: 759px) { #sv-replay .sv-replay { --sv-bar: 64px; } }
@container sv-replay (max-width: 559px) {
  #sv-replay .sv-replay { --sv-bar: 56px; padding: 8px !important; }
  #sv-replay .sv-col-qp, #sv-replay .sv-col-kind { display: none; }
  #sv-replay .sv-drafts td, #sv-replay .sv-drafts th, #sv-replay .sv-top td, #sv-replay .sv-top th {
    padding-left: 4px !important; padding-right: 4px !important; }
  /* widths set by the heading, not by the longest token: the verdict keeps its place, a long token wraps */
  #sv-replay .sv-drafts { table-layout: fixed; }
  #sv-replay .sv-drafts th.sv-col-n { width: 1.8em; }
  /* a tree round's rejected siblings: a note across every column (folded ones too, which a fixed layout would give
     room to) and labels "depth 2, under ..." that wrap */
  #sv-replay .sv-drafts:has(td[colspan]) { table-layout: auto; }
  #sv-replay .sv-drafts td.sv-col-n { white-space: normal !important; }
  #sv-replay .sv-drafts th.sv-col-draft { width: 25%; }
  #sv-replay .sv-drafts th.sv-col-verdict { width: 6em; }
  #sv-replay .sv-drafts .sv-col-draft code { word-break: break-all; }
}
#sv-replay-tab:has(#sv-replay-all input:checked) #sv-replay .sv-col-beta,
#sv-replay-tab:has(#sv-replay-all input:checked) #sv-replay .sv-col-qp,
#sv-replay-tab:has(#sv-replay-all input:checked) #sv-replay .sv-col-kind { display: table-cell; }
#sv-replay-tab:has(#sv-replay-all input:checked) #sv-replay .sv-drafts { table-layout: auto; }
#sv-replay-tab:has(#sv-replay-all input:checked) #sv-replay .sv-drafts .sv-col-draft code { word-break: normal; }
"""

# Run once in the page's head: figures follow their box's width (one drawn in a hidden tab took
# plotly's default 700 px), and a tapped token's details are placed inside the window.
HEAD = f"<style>{HEAD_CSS}</style><script>{FIT_SCRIPT}{TIP_SCRIPT}</script>"
