"""Views: pure functions from traces to HTML, text and plotly figures. No model, no UI state."""

from specviz.views.charts import acceptance_figure, round_costs_figure, timeline_figure
from specviz.views import notebook  # noqa: F401  (registers the notebook display of Trace and Recording)
from specviz.views.explain import BATCH_NOTE, THEORY_NOTE, explanation_markdown
from specviz.views.race import race_html, slowdown_for
from specviz.views.replay import round_html
from specviz.views.stats import stats_html, summary
from specviz.views.terminal import tokens_ansi
from specviz.views.theory import accepted_histogram_figure, position_figure, speedup_figure, sweep_figure
from specviz.views.tokens import legend_html, tokens_html

__all__ = [
    "acceptance_figure",
    "accepted_histogram_figure",
    "BATCH_NOTE",
    "THEORY_NOTE",
    "explanation_markdown",
    "legend_html",
    "position_figure",
    "race_html",
    "round_html",
    "slowdown_for",
    "speedup_figure",
    "stats_html",
    "summary",
    "sweep_figure",
    "round_costs_figure",
    "timeline_figure",
    "tokens_ansi",
    "tokens_html",
]
