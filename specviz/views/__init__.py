"""Views: pure functions from traces to HTML, text and plotly figures. No model, no UI state."""

from specviz.views.charts import acceptance_figure, timeline_figure
from specviz.views.stats import stats_html, summary
from specviz.views.terminal import tokens_ansi
from specviz.views.tokens import legend_html, tokens_html

__all__ = ["acceptance_figure", "legend_html", "stats_html", "summary", "timeline_figure", "tokens_ansi", "tokens_html"]
