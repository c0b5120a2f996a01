"""The page itself: its layout and wiring, CSS, a run's outputs by name, per-session state, the measured evidence."""
