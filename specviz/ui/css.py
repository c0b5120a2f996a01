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
