"""A short run that comes just after another visitor switched pairs, through the served app: how much slower it gets.

``python -m specviz.visitors.pair_switch`` starts the app (the embedded pair loaded, three pairs kept), times a
victim's Generate of the embedded pair alone (median of 3), then, for each pair the other visitor switches to (the
English pair, then the cross-tokenizer pair; neither loaded yet), starts that visitor's 1-token Generate of it from
another address and the victim's Generate 0.3 s later, and prints the victim's seconds over its time alone and how long
the switcher waited (its own load included). ``--trials`` repeats it on a fresh app each time (a load happens once per
app). Needs the English pair's offline copy (README's demo command installs it).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from specviz.visitors import attack

SWITCHES = {"english": "model", "cross": "cross-tokenizer"}  # the pair the other visitor switches to: its drafter kind
SWITCHER = {"X-Forwarded-For": "10.6.6.1"}


def one_switch(app: attack.App, pair: str, after_s: float) -> tuple[float, float]:
    """(the victim's seconds, the switcher's) for a switch to ``pair`` and the victim's run ``after_s`` later."""
    data = list(attack.GENERATE)
    data[0], data[6], data[11] = pair, 1, SWITCHES[pair]
    took: dict[str, float] = {}

    def switch():
        start = time.monotonic()
        with attack.client("127.0.0.62") as http:
            attack.page_call(http, app, "generate", data, SWITCHER)
        took["switcher"] = time.monotonic() - start

    thread = threading.Thread(target=switch)
    thread.start()
    time.sleep(after_s)
    victim = attack.victim_runs(app, 1)[0]
    thread.join()
    return victim, took["switcher"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=2, help="fresh apps, each with both switches (default 2)")
    parser.add_argument("--tokens", type=int, default=16, help="the victim's new tokens (default 16)")
    parser.add_argument("--after-s", type=float, default=0.3, help="the victim starts this long after (default 0.3)")
    args = parser.parse_args(argv)
    attack.VICTIM_TOKENS[0] = args.tokens
    root = Path(__file__).resolve().parents[2]
    ratios = []
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory() as tmp:
            app = attack.App(root, Path(tmp) / "gradio", Path(tmp) / "app.log")
            try:
                alone = statistics.median(attack.victim_runs(app, 3))
                for pair in SWITCHES:
                    victim, switcher = one_switch(app, pair, args.after_s)
                    ratios.append(victim / alone)
                    print(
                        f"trial {trial + 1}, a switch to {pair}: the victim {victim:.2f} s against {alone:.2f} s alone "
                        f"({victim / alone:.2f}x); the switcher waited {switcher:.2f} s",
                        flush=True,
                    )
            finally:
                app.stop()
    print(f"victim over alone: median {statistics.median(ratios):.2f}x, worst {max(ratios):.2f}x")


if __name__ == "__main__":
    main()
