"""A short run beside another visitor's pair load, in one process as the server runs them: how much slower it gets.

``python -m specviz.visitors.beside_load`` loads the embedded pair on the device thread, times a victim's 16-token
run of it (the speculative run and its baseline in turns, as Generate runs them, each turn a device step for the
victim) several times alone, at the server's switch interval, then runs it back to back while the load thread loads
the English pair for another visitor (``specviz.ui.running.pairs.ensure_pair``'s path), and prints each run's
seconds, the median and worst over the median alone, and how long the load took. The victim runs without a pause, so
this is the worst case: a visitor's runs in a page are seconds apart. Needs the English pair's offline copy (README's
demo command installs it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

from specviz import openmp


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16, help="the victim's new tokens (default 16)")
    parser.add_argument("--alone", type=int, default=5, help="victim runs timed alone (default 5)")
    parser.add_argument("--load", default="english", help="the preset another visitor loads (default english)")
    args = parser.parse_args(argv)
    openmp.spin_briefly()
    os.environ.setdefault("SPECVIZ_RESIDENT_PAIRS", "2")  # the victim's pair stays loaded, as on a server keeping 3
    from specviz.ui.guard.server import GIL_SWITCH_S

    sys.setswitchinterval(GIL_SWITCH_S)  # as the server runs

    from specviz.drafters import default_kind
    from specviz.engine.sampling import DEFAULT_SAMPLING
    from specviz.measure.baseline import with_baseline_stream
    from specviz.pair import load_pair
    from specviz.pair.drafter import pair_drafter
    from specviz.serving import device_thread, load_thread
    from specviz.ui.running.pairs import encode

    pair = device_thread.run(load_pair, name="embedded")
    drafter = pair_drafter(default_kind(pair), pair)
    ids = encode(pair, "def is_prime(n):", True)
    victim, loader = device_thread.Owner("10.0.0.1", "victim"), device_thread.Owner("10.0.0.2", "loader")
    common = dict(sampling=DEFAULT_SAMPLING, eos_token_id=pair.eos_token_ids, seed=0, tokenizer=pair.tokenizer)

    def run() -> float:
        start = time.perf_counter()
        turns = with_baseline_stream(ids, drafter, pair.target, gamma=4, max_new_tokens=args.tokens, **common)
        for _ in device_thread.stepped(turns, victim):
            pass
        return time.perf_counter() - start

    for _ in range(3):
        run()  # first-call costs
    alone = [run() for _ in range(args.alone)]
    base = statistics.median(alone)
    print(f"victim alone: {' '.join(f'{t:.3f}' for t in alone)} s (median {base:.3f} s)", flush=True)
    loaded, took = threading.Event(), []

    def load() -> None:
        start = time.perf_counter()
        try:
            load_thread.run(load_pair, name=args.load, owner=loader)
        finally:
            took.append(time.perf_counter() - start)
            loaded.set()

    threading.Thread(target=load, daemon=True).start()
    during = []
    while not loaded.is_set():
        during.append(run())
    print(f"victim beside the load: {' '.join(f'{t:.3f}' for t in during)} s", flush=True)
    print(
        f"median {statistics.median(during) / base:.2f}x, worst {max(during) / base:.2f}x its median alone; "
        f"the load of {args.load} took {took[0]:.2f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
