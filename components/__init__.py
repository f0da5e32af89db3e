"""GROM Studio's app layer, in four rooms and a roof (app.py lays the panels out and has each
wire its own events):

- `components.server`: the ground floor, the machinery of a public model server that would
  serve any model app: errors, host limits and rates, the guard, gradio's sessions bounded,
  sessions and the shared models, sources a visitor may type, the device line, its memory
  budget and single flights, the host's pace, GPU durations and costs, input validators.
  It imports nothing else of the app.
- `components.studio`: the studio's services on top of it: the Edit form, benchmarks, edits,
  layer scores, the comparison and its kept cards, the methods beside GROM, the run history,
  links and downloads, staleness, and what crosses panels (`wiring`). It imports the server
  room, no panel and no view.
- `components.views`: pure view builders (plots, tables, the word diff, the page's text).
- `components/*_panel.py`: one file per panel (`build_*()` returns its widgets, `on_*`
  are its handlers, `wire(widgets, page)` its events). A panel never imports another
  panel: what crosses panels goes through `components.studio.wiring.Page`.
- `components/page.py`: the page as a whole (a new page, an edit done, new data, the
  warm-up); it may import panels, and no panel imports it.

Nothing here does math: every computation is a call into `grom`.
"""
