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

# Run once in the page's head: figures follow their box's width (one drawn in a hidden tab took
# plotly's default 700 px), and a tapped token's details are placed inside the window.
HEAD = f"<script>{FIT_SCRIPT}{TIP_SCRIPT}</script>"

# The page's three columns (specviz.ui.layout): what to run, what it shows, the settings. On a wide
# screen a grid puts what it shows (output, stats and the tabs) on the right beside the other two
# (the tabs had started about 1,980 px down at 1920 x 1080 under an empty right column); narrower,
# they stack in that order, so on a phone the output comes right after the prompt and Generate
# (it had started 3,400 px down, under every setting).
CSS += """
@media (min-width: 1100px) {
  #sv-main { display: grid !important; grid-template-columns: minmax(320px, 2fr) minmax(0, 3fr);
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
#sv-rank-table table.sv-rank-table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-variant-numeric: tabular-nums; }
#sv-rank-table table.sv-rank-table caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
#sv-rank-table table.sv-rank-table th, #sv-rank-table table.sv-rank-table td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; white-space: nowrap; }
"""
