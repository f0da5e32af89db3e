"""What crosses panels when the page is wired: the event settings every panel uses (`LOCAL`,
`LINKS`, `device_queue`), and `Page`, the one object each panel's `wire(widgets, page)`
receives: the session, the tabs, every panel's widgets (for an event whose outputs span
panels, such as a link's restore) and the events other panels react to ("model loaded",
"data loaded", "edit run", ...).

Each cross-panel event is set once, by the panel that owns its button, and read by the
panels wired after it (app.py wires them in that order); reading one not wired yet is an
error at build time, never a silent no-op."""
from __future__ import annotations

from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

from components.server.device import DEVICE_QUEUE
from components.server.limits import limit
from components.studio.downloads import table_files

# an event that only reads or redraws widgets: no queue, no API endpoint
LOCAL = dict(queue=False, api_visibility="private")
# opening a link to a run: its own queue, as a model load (a link may load the run's model, downloading
# without the device lock); an edit computed again for it takes the device in turn, as every computation
LINKS = dict(concurrency_id="open_link", concurrency_limit=4)


def device_queue() -> dict:
    """The settings of every event that touches the model: one gradio queue admitting
    GROM_DEVICE_JOBS at once, which then take turns on the device in the order they asked
    (`DEVICE_LOCK`; a long job between its steps)."""
    return dict(concurrency_id=DEVICE_QUEUE, concurrency_limit=limit("GROM_DEVICE_JOBS"))


def offer_files(table, files, name: str) -> None:
    """Whenever `table` changes, its rows as CSV and JSON under it."""
    table.change(lambda value: table_files(value, name), table, files, **LOCAL)


_EVENTS = ("page_linked", "model_loaded", "data_loaded", "edit_run", "edit_done", "edit_compared", "compared",
           "link_pasted", "run_imported", "attacked", "baseline_trained", "swept")


@dataclass(repr=False)
class Page:
    """The page's shared state and the events that cross panels (gradio dependencies:
    `.success`, `.then` and `.failure` chain on them)."""
    session: Any  # gr.State: this browser tab's Session
    tabs: Any  # gr.Tabs: the views on the right
    ui: SimpleNamespace  # every panel's widgets, by panel (app.build_layout)
    page_linked: Any = None  # the page opened, and its ?run= link (if any) restored (components.page)
    model_loaded: Any = None  # Load model (model_panel)
    data_loaded: Any = None  # Load benchmark (benchmark_panel)
    edit_run: Any = None  # Run edit, the edit computed (edit_panel)
    edit_done: Any = None  # after a successful edit: its status, plot and tabs drawn (components.page)
    edit_compared: Any = None  # the edit's card and comparison after it, drawn (compare_panel)
    compared: Any = None  # the Compare button's comparison (compare_panel)
    link_pasted: Any = None  # a pasted link to a run, opened (export_panel)
    run_imported: Any = None  # an imported edit.json, restored (export_panel)
    attacked: Any = None  # the attack suite, run (attack_panel)
    baseline_trained: Any = None  # a baseline trained and compared (baseline_panel)
    swept: Any = None  # a sweep of one setting, run (sweep_panel)

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if value is None and name in _EVENTS:
            raise RuntimeError(f"Page.{name} is read before the panel that sets it is wired (app.wire_panels)")
        return value

    @property
    def run_opened(self) -> list:
        """A run's model and data now in the session: the page's own link and a pasted one."""
        return [self.page_linked, self.link_pasted]


assert set(_EVENTS) <= {f.name for f in fields(Page)}
