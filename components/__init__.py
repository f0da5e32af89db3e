"""GROM Studio's panels, one module per panel (`build_*()` returns its handles), the pure
plotly builders (`plots`), and the per-session state with the one device lock (`session`).

Nothing here does math: every computation is a call into `grom`.
"""
