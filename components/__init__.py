"""GROM Studio's app layer, in three rooms (app.py composes them and wires every event):

- `components.core`: the ground floor. Errors, host limits, sources, the device lock,
  sessions, input validators, the Edit form, the server guard, and the session-side
  services the panels share (models, benchmarks, edits, scores, comparisons, history).
  It imports no panel and no view.
- `components.views`: pure view builders (plots, tables, the word diff, the page's text).
- `components/*_panel.py`: one file per panel (`build_*()` returns its widgets, `on_*`
  are its handlers). A panel never imports another panel.

Nothing here does math: every computation is a call into `grom`.
"""
