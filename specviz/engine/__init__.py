"""The engine: one round of speculative decoding and the loops built from it.

``chain`` (the speculative loop and its autoregressive baseline), ``tree`` (token trees), ``batch``
(several sequences at once); ``rounds`` holds what every loop shares, ``rejection`` the maths of one
round, ``sampling`` the processing applied to q and p alike, ``runner``, ``cache`` and ``graphs`` the
ways a model is fed (a dynamic KV cache, a static one, CUDA graphs over it). The engine knows nothing
of any UI: its loops yield ``specviz.trace.Trace`` objects. The public API is re-exported by
``specviz`` itself (``speculative_generate``, ``autoregressive_generate``, ``Sampling``).
"""
