"""The engine: one round of speculative decoding and the loops built from it.

``chain`` (the speculative loop and its autoregressive baseline), ``tree`` (token trees), ``batch``
(several sequences at once); ``rounds`` holds what every loop shares, ``rejection`` the maths of one
round, ``sampling`` the processing applied to q and p alike, ``runner``, ``cache`` and ``graphs`` the
ways a model is fed (a dynamic KV cache, a static one, CUDA graphs over it). The engine knows nothing
of any UI: its loops yield ``specviz.trace.Trace`` objects. The public API is re-exported by
``specviz`` itself (``speculative_generate``, ``autoregressive_generate``, ``Sampling``).
"""

# Which engine recorded a saved run. Raised whenever a change alters what a recorded run measures (its tokens for a
# seed, or how fast its passes run on the same machine): a recording made by an older engine replays as it was, and
# the page says that its times are not what this build runs at. 1: until the fp32 products were routed and bf16
# chosen per CPU (the first prepared English recordings, v about 1.85 on a CPU); 2: since (the graphed CUDA engine,
# routed CPU products, prompt lookup skipping special tokens).
ENGINE_VERSION = 2
