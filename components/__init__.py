"""GROM Studio's app layer, in three rooms and a roof (app.py lays the panels out and has each
wire its own events):

- `components.core`: the ground floor. Errors, host limits, sources, the device lock,
  sessions, input validators, the Edit form, the server guard, and the session-side
  services the panels share (models, benchmarks, edits, scores, comparisons, history).
  It imports no panel and no view.
- `components.views`: pure view builders (plots, tables, the word diff, the page's text).
- `components/*_panel.py`: one file per panel (`build_*()` returns its widgets, `on_*`
  are its handlers, `wire(widgets, page)` its events). A panel never imports another
  panel: what crosses panels goes through `components.core.wiring.Page`.
- `components/page.py`: the page as a whole (a new page, an edit done, new data, the
  warm-up); it may import panels, and no panel imports it.

Nothing here does math: every computation is a call into `grom`.
"""
