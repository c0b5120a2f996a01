"""The app driven over HTTP as visitors would, each a command that launches ``app.py`` in a process of its own and
prints what it measured (``python -m specviz.visitors.<name>``; Linux only, nothing asserted):

- ``sessions``: the app's memory under many sessions and its disk under an upload flood.
- ``attack``: a victim's short run under each flood an attacker tried, Stop and hang-up, memory and disk after.
- ``classroom``: a class of students behind one school address, beside two hostile addresses.
- ``page_speed``: what the page adds to the engine's time, and /run's rate against bench's.

They send the page's own inputs (its defaults, its menus' choices), so they sit above the UI; the engine's
measurements, which know no page, are ``specviz.measure``.
"""
