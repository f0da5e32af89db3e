"""Export panel: the session's edit as files (patch.safetensors + edit.json, and after a
comparison on TOFU or the demo its result as OpenUnlearning's TOFU_EVAL.json and
TOFU_SUMMARY.json) and a code snippet that applies it with the library; and the way back: an uploaded edit.json restores
the benchmark, every setting and the edit, computed again and checked against the hash
edit.json records (or, for uploaded benchmark files, from patch.safetensors).

And a link to the run (components/studio/links.py): "Copy link to this run" stores the
session's edit on the server under an unguessable token and gives the page's address with
?run=<token>; a page opened with it (`on_page_link`, after the page's own load) brings the
run into its fresh session: the run's model (loaded where the host allows it), its
benchmark and split, every setting of the Edit panel, the edit (from its stored patches,
bit for bit, or computed again from its settings) and the result view, as they were. A
link pasted into an open page does the same (`on_open_link`, the `open_link` endpoint)."""
from __future__ import annotations

import json
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from components.server.allowed_sources import DEMO
from components.server.device import device_progress, job_visitor, local_progress
from components.server.errors import UserError, shorten, ui_errors
from components.server.files import (
    bound_disk,
    edit_uploads,
    export_root,
    load_uploaded_edit,
    read_edit_json,
    remove_old,
    storage,
)
from components.server.limits import limit
from components.server.model_choices import ensure_model, free_choice, model_key, status_line
from components.server.model_choices import summary as model_summary
from components.server.rates import FairRate
from components.server.session import REGISTRY, SESSIONS, Session, current_edit, current_model, in_turn
from components.server.validate import check_examples, retain_subset
from components.studio import cards, form, links
from components.studio.benchmarks import SESSION_DATA, read_benchmark, splits_for
from components.studio.edits import compute_edit
from components.studio.form import BAND_MODES, CUSTOM, RESTORED, restore_values
from components.studio.history import add_run, restore
from components.studio.runs import check_run, file_verdict, portable_model_name, recompute_verdict, run_record
from components.studio.wiring import LINKS, LOCAL, Page, device_queue
from components.views import text
from components.views.tables import describe, edit_summary, examples_html, layer_table, norms_figure
from grom import PRESETS, Edit, EditConfig
from grom.edit import META_FILE, PATCH_FILE, read_patch_layout, read_settings
from grom.eval.openunlearning import EVAL_FILE, SUMMARY_FILE, write_openunlearning
from grom.eval.results import EDITED
from grom.model.arch import num_layers

_EXPORTS = FairRate(lambda: limit("GROM_VISITOR_EXPORTS_PER_MINUTE"), lambda: limit("GROM_EXPORTS_PER_MINUTE"))


def _admit_export() -> None:
    """At most GROM_VISITOR_EXPORTS_PER_MINUTE new exports (and links) a minute from one
    visitor, and GROM_EXPORTS_PER_MINUTE on the whole server, of which a visitor who has had
    less than an equal share still gets one (`rates.FairRate`)."""
    over = _EXPORTS.refusal(job_visitor())
    if over == "visitor":
        raise UserError("You have made as many exports and links as this server makes for one visitor in a "
                        "minute (GROM_VISITOR_EXPORTS_PER_MINUTE); try again in a minute.")
    if over == "server":
        raise UserError("This server has written as many exports and links as it writes in a minute, and you "
                        "have had your share of them (GROM_EXPORTS_PER_MINUTE); try again in a minute.")


PENDING = ("# Press Export the edit: the code that applies it to its model, and asks it a question\n"
           "# before and after, comes here.\n")  # the code box before the session is known


def snippet(model_name: str | None, folder: str, question: str = "") -> str:
    """The code that applies the export in `folder` to `model_name` (None: not known yet,
    the code box's text before an export) and asks `question` before and after."""
    if model_name is None:
        return PENDING
    code = text.SNIPPET.format(model=model_name, folder=folder,
                               question=shorten(question or "Tell me what you know.", 300))
    if model_name == DEMO:
        code = code.replace("from grom.model.loading import load_model\n", "from grom.demo import load_demo_model\n")
        code = code.replace(f"load_model({model_name!r})", 'load_demo_model("full")')
    return code


def example_question(examples) -> str:
    """A prompt of the first forget example that has one (a question, a fact's prompt, a
    text's first words)."""
    for ex in examples or ():
        prompt = getattr(ex, "question", "") or getattr(ex, "prompt", "")
        if prompt or getattr(ex, "text", ""):
            return prompt or " ".join(ex.text.split()[:30])
    return ""


def session_snippet(session: Session, folder: str = "grom-edit") -> str:
    """The snippet for the session's model and a question of its edit's (else its loaded)
    benchmark."""
    key = session.edit_for or session.model_key
    inputs = session.extra.get("edit_inputs")
    bench = session.benchmark
    examples = inputs[0] if inputs else (bench.forget if bench is not None else ())
    return snippet(portable_model_name(key.name) if key is not None else None, folder,
                   example_question(examples))


def on_show_snippet(session: Session):
    """The code box for the session's model (on page load and after a new model or
    benchmark), unless it shows the export of the session's current edit."""
    done = session.extra.get("export")
    if done is not None and session.edit is not None and done[0] is session.edit:
        return gr.skip()
    return session_snippet(session)


@ui_errors
def on_export(session: Session):
    """Save the edit into a fresh folder (patches as factors where smaller); returns the
    two files, a note (size, storage, sha256) and the snippet."""
    edit = current_edit(session)
    root = export_root()
    root.mkdir(parents=True, exist_ok=True)
    remove_old(root)
    done = session.extra.get("export")
    if done is not None and done[0] is edit and all(Path(f).is_file() for f in done[1]):
        folder = Path(done[1][0]).parent  # the same edit again: the files it has already
    else:
        _admit_export()
        folder = Path(tempfile.mkdtemp(prefix="grom-edit-", dir=root))
        edit.save(folder, factored=True)
        bound_disk(root, limit("GROM_EXPORT_MAX_MB") << 20)
    files = [str(folder / PATCH_FILE), str(folder / META_FILE)]
    session.extra["export"] = (edit, files)
    size = sum(Path(f).stat().st_size for f in files) / 2**20
    logs = openunlearning_logs(session, edit, folder)
    sha = json.loads((folder / META_FILE).read_text())["patch_sha256"]
    ranks = {name: p.rank for name, p in read_patch_layout(folder / PATCH_FILE).items()}
    note = (f"Saved {len(edit.patches)} patch(es) ({storage(ranks)}), "
            f"{size:.2f} MiB; sha256 `{sha[:16]}…`. `edit.json` alone brings the edit back here (Load a run "
            "computes it again and checks that hash). Download both files into one folder (here "
            "`grom-edit`) and run:")
    if logs:
        note = (f"`{EVAL_FILE}` and `{SUMMARY_FILE}` hold this edit's last comparison in OpenUnlearning's "
                "format (forget quality against its retain model), to set beside an OpenUnlearning log. " + note)
    return files + logs, note, session_snippet(session)


def openunlearning_logs(session: Session, edit, folder: Path) -> list[str]:
    """The session's comparison of `edit` (a TOFU-task one: TOFU or the demo world) as
    OpenUnlearning's TOFU_EVAL.json and TOFU_SUMMARY.json in `folder`
    (`grom.eval.openunlearning`); none without such a comparison."""
    report, made_for = session.report, session.report_for
    if report is None or made_for is None or made_for[1] is not edit or report.task != "tofu" \
            or report.stage != "full" or EDITED not in report.rows:
        return []
    return [str(p) for p in write_openunlearning(report, folder, benchmark=made_for[0])]


@dataclass
class _Import:
    """An uploaded run, checked: its files, settings, the session's model and the data."""

    meta_file: Path
    patch_file: Path | None
    meta: dict
    run: dict
    config: EditConfig
    handle: object
    bench: object  # the run's benchmark as this server reads it; None for uploaded files


def _check_import(files, session: Session) -> _Import:
    """Every file and value as the Edit panel would take it, before anything is changed."""
    meta_file, patch_file = edit_uploads(files)
    meta = read_edit_json(meta_file)
    run = check_run(meta.get("run"))
    settings = read_settings(meta.get("method", "grom"), meta)
    # the Edit panel's GROM settings: a GROM edit's own; another method's edit leaves them at GROM's defaults
    config = settings if isinstance(settings, EditConfig) else EditConfig(prompt_format=settings.prompt_format)
    handle = current_model(session)
    loaded = portable_model_name(handle.key.name)
    if run["model"] != loaded:
        raise UserError(f"This run was made with the model {shorten(run['model'])}, and {loaded} is loaded: "
                        f"load {shorten(run['model'])} in the Model panel, then load the run again.")
    try:
        restore_values(config.to_dict(), run, num_layers(handle.model))
    except UserError as err:
        raise UserError(f"{shorten(meta_file.name)}: {err}") from None
    if run["benchmark"] in SESSION_DATA:
        if patch_file is not None and (session.benchmark is None
                                       or not (session.bench_label or "").startswith(run["benchmark"] + "/")):
            raise UserError(f"This run used {SESSION_DATA[run['benchmark']]} (benchmark {run['benchmark']}): load "
                            "them in the Benchmark panel first, then load the run again.")
        return _Import(meta_file, patch_file, meta, run, config, handle, None)
    if run["split"] not in splits_for(run["benchmark"]):
        raise UserError(f"{shorten(meta_file.name)}: the benchmark {shorten(run['benchmark'])} has no split "
                        f"{shorten(run['split'])!r} (its splits: {', '.join(splits_for(run['benchmark'])) or 'none'}).")
    bench = read_benchmark(run["benchmark"], run["split"], run.get("source", ""), None, None, handle.key.name)
    return _Import(meta_file, patch_file, meta, run, config, handle, bench)


def _import_edit(imp: _Import, progress) -> tuple[Edit | None, tuple | None, str]:
    """(the edit, its forget and retain examples, the verdict): recomputed where this
    server has the run's data, else from the uploaded patch; (None, None, why) when neither."""
    reference = (load_uploaded_edit(imp.meta_file, imp.patch_file, imp.handle.model, imp.meta)
                 if imp.patch_file else None)
    if imp.bench is None or imp.meta.get("method", "grom") != "grom":
        if reference is None:
            kind = imp.run["benchmark"]
            return None, None, (f" Its benchmark was {SESSION_DATA.get(kind, 'data of its session')} ({kind}): "
                                "load them in the Benchmark panel (and upload its patch.safetensors with edit.json "
                                "to get the edit itself)."
                                if imp.bench is None else " Upload its patch.safetensors to get the edit itself.")
        return reference, None, file_verdict(reference, imp.patch_file.name)
    retain = retain_subset(imp.bench.retain, imp.run["retain_examples"], imp.run["seed"])
    check_examples(imp.bench.forget, retain, imp.handle.tokenizer, "Recomputing this edit")
    t0 = time.perf_counter()
    edit = compute_edit(imp.handle.key, imp.bench.forget, retain, imp.config, None,
                        device_progress(lambda f, msg: progress(f, desc=f"recomputing: {msg}")))
    seconds = time.perf_counter() - t0
    edit.model_name = portable_model_name(imp.handle.key.name)
    r = imp.run
    edit.run = run_record(imp.handle.key.name, f"{r['benchmark']}/{imp.bench.split}", r.get("source", ""),
                          r["retain_examples"], r["seed"], len(retain), r.get("preset", ""),
                          r.get("band_mode", "manual"), r.get("k", len(edit.band) or 1), edit.band)
    return edit, (imp.bench.forget, retain), recompute_verdict(edit, imp.meta.get("patch_sha256"), seconds, reference)


def _restore_run(imp: _Import, edit: Edit | None, inputs: tuple | None, session: Session, what: str,
                 source: str) -> tuple[list, list, str, tuple | None]:
    """Into the session, once everything is checked: the run's benchmark (where this server
    has it), the Edit panel's settings and the edit, if there is one (a row of the run
    history, as `source`). Returns the widgets' values (`form.RESTORED` order), the
    Benchmark panel's six (skips for uploaded files), the restore's note and the edit's
    forget and retain examples."""
    run, bench = imp.run, imp.bench
    bench_out = [gr.skip()] * 6
    if bench is not None:
        if bench is not session.benchmark:
            session.scores = session.scores_for = None
        session.benchmark, session.bench_label = bench, f"{run['benchmark']}/{bench.split}"
        session.extra["bench_source"] = run.get("source", "")
        # the benchmark box reacts to the user's choice only: the split's choices come here
        bench_out = [run["benchmark"], gr.Dropdown(choices=splits_for(run["benchmark"]), value=bench.split),
                     run.get("source", ""), describe(bench),
                     examples_html(bench.forget, f"Forget set: {len(bench.forget)} examples"),
                     examples_html(bench.retain, f"Retain set: {len(bench.retain)} examples")]
    values = restore(imp.config.to_dict(), run, session, what, with_edit=edit is not None)
    if edit is not None:
        if inputs is None:  # from its file: the data it was made of is the session's
            b = session.benchmark
            inputs = (b.forget, retain_subset(b.retain, run["retain_examples"], run["seed"]))
        session.edit, session.edit_for, session.dropped = edit, imp.handle.key, ""
        SESSIONS.touch(session)  # counted among the sessions holding an edit
        session.extra["edit_inputs"] = inputs
        session.report = session.report_for = session.influence = None
        add_run(session, edit, source=source)
    return values[:-1], bench_out, values[-1], inputs


@ui_errors
def on_import_run(files, session: Session, progress=gr.Progress()):
    """Restore an exported run: the benchmark, every setting of the Edit panel and the
    band, and the edit. Where this server has the run's data, edit.json alone is enough:
    the edit is computed again with its settings and checked against the patch_sha256 it
    records (`recompute_verdict`: identical means bit for bit); for uploaded benchmark
    files it comes from patch.safetensors. Nothing changes unless all of it fits."""
    imp = _check_import(files, session)
    edit, inputs, verdict = _import_edit(imp, progress)  # the long part, before any change
    values, bench_out, restored, _ = _restore_run(imp, edit, inputs, session, f"the run of {imp.meta_file.name}",
                                                  "import")
    if edit is None:
        return values + bench_out + [gr.skip()] * 3 + [restored + verdict]
    note = f"{restored} {verdict} The edit is loaded: Compare, Diagnostics and Export use it."
    result = [f"{verdict} " + edit_summary(edit), layer_table(edit), norms_figure(edit)]
    return values + bench_out + result + [note]


# ---------------------------------------------------------------- a link to the run

LINK_INTRO = ("**Share this run.** *Copy link to this run* gives an address that opens it in a fresh page, in "
              "any browser: the model, the benchmark and split, every setting and the edit, as they are here. "
              "The server keeps the edit (its settings and patches, no file of yours) under a random name "
              "that only the link holds; it does not keep uploaded benchmark files, so a run of those is shared "
              "by its exported files instead.")
OPEN_INTRO = "**Open a shared run.** Paste a link to a run of this server: the run replaces this page's."
COPY_LINK_JS = "(url) => { if (url && navigator.clipboard) { navigator.clipboard.writeText(url).catch(() => {}); } }"
"""The link into the clipboard after `on_make_link` (where the browser allows it; the box's
copy button otherwise)."""
LINK_OUTPUTS = 5 + len(RESTORED) + 6 + 3 + 3 + 1
"""What opening a link sets, in this order: the Model panel's status, summary, choice,
device and dtype; the Edit panel's widgets (`form.RESTORED`; k with the model's layers as
its maximum); the Benchmark panel's name, split, source, info and the forget and retain
tables; the result view's summary, table and norms; the Edit panel's status line, the
Export tab's link note and the tabs (Edit details shown)."""


@ui_errors
def on_make_link(session: Session, request: gr.Request):
    """A link to the session's edit (`links.store`; the same edit again: the link it has
    already) and a note on what it opens and for how long. The address is the page's as
    the visitor reached it (`links.page_url`), behind a proxy too."""
    edit = current_edit(session)
    run = edit.run or {}
    if not run.get("model") or not run.get("benchmark"):
        raise UserError("This edit records no run (its model, benchmark and split): press Run edit to make it "
                        "again, then copy its link.")
    if run["benchmark"] in SESSION_DATA:
        raise UserError(f"This edit is of {SESSION_DATA[run['benchmark']]}, which this server does not keep, so a "
                        "link could not bring them back: press Export the edit and share its two files with "
                        "the data instead.")
    form = links.stored_form(edit)  # an edit no link can hold is refused before anything is written
    kept = session.extra.get("link")
    if kept is not None and kept[0]() is edit and links.exists(kept[1]):
        token = kept[1]  # the same edit again: its link
    else:
        _admit_export()
        card = session.extra.get("card_html")  # (edit, its whole card): compare_panel.keep_card
        token = links.store(edit, session.edit_for.dtype if session.edit_for is not None else "", job_visitor(),
                            card[1] if card is not None and card[0] is edit else "")
        session.extra["link"] = (weakref.ref(edit), token)  # weak: a dropped edit goes with its session's
    how = ("its patches kept bit for bit" if form == "patches" else
           "computed again when the link is opened (its patches are larger than a link keeps) and checked "
           "against its sha256")
    note = (f"Anyone with this link opens this run in a fresh page: the model **{shorten(run['model'])}**, "
            f"**{shorten(run['benchmark'])}/{shorten(run.get('split', ''))}**, every setting of the Edit panel and "
            f"the edit ({how}). Copied to your clipboard where the browser allows it, else with the box's copy "
            f"button. This server keeps links for {links.kept_for()}.")
    return links.page_url(request, token), note


def _link_model(name: str, dtype: str, session: Session, progress) -> list:
    """The run's model (in `dtype`, where the link records it) for the session: the one it
    has, or loaded where the host allows it (`model_key`: GROM_MODELS; a visitor's free
    choice sized first, GROM_MAX_MODEL_PARAMS). The Model panel's status, summary, choice,
    device and dtype (skips when unchanged)."""
    key = session.model_key
    if (key is not None and portable_model_name(key.name) == name and dtype in ("", key.dtype)
            and REGISTRY.get(key) is not None):
        return [gr.skip()] * 5
    key = model_key(name, "auto", dtype or "auto")
    handle = ensure_model(key, local_progress(lambda f, m: progress(f, desc=m)), free=free_choice(key))
    if session.model_key != handle.key:
        session.model_key = handle.key
        session.scores = session.scores_for = None
    session.extra["model_widgets"] = (handle.key.shown, "auto", dtype or "auto", "none", "")
    return [status_line(handle), model_summary(handle), handle.key.shown, "auto", dtype or "auto"]


def _linked_verdict(edit: Edit) -> str:
    """What the loaded patches are to the shared edit (`Edit.load` checked them)."""
    if edit.stored_ranks:
        return "Its patches are the shared edit's factors (their product: equal to it up to rounding)."
    return f"Its patches are the shared edit's, bit for bit (sha256 `{edit.sha256()[:16]}…`)."


def data_line(label: str, forget, retain) -> str:
    """The data part of the result summary, as Run edit writes it (edit_panel `on_run_edit`)."""
    return f" Data: **{label}**, {len(forget)} forget and {len(retain)} retain examples giving keys."


def _plain_run(meta_file: Path) -> None:
    """The run's free text that the notes repeat, reduced to the values this server writes
    (a preset's name, a band mode), in the link's private copy of edit.json: a run imported
    from a hostile file and shared puts no text of its author's into another visitor's page."""
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    run = meta.get("run")
    if isinstance(run, dict):
        if "preset" in run and run["preset"] not in PRESETS:
            run["preset"] = CUSTOM
        if "band_mode" in run and run["band_mode"] not in BAND_MODES:
            run["band_mode"] = "manual"
        meta_file.write_text(json.dumps(meta, indent=2), encoding="utf-8")


def _open_link(text, session: Session, progress) -> list:
    """The run of the link in `text` into the session (`LINK_OUTPUTS`): every file and
    value checked as an uploaded run's (`_check_import`) after the run's model is loaded;
    the edit from its stored patches, else computed again from its settings. Nothing
    changes unless all of it fits (a model loaded for it stays loaded, unused)."""
    with links.opened(text) as link:
        meta = read_edit_json(link.meta_file)
        _plain_run(link.meta_file)
        run = check_run(meta.get("run"))
        if run["benchmark"] in SESSION_DATA:
            raise UserError(f"This link's run is of {SESSION_DATA[run['benchmark']]}, which this server does not "
                            "keep: ask whoever shared it for the exported files.")
        before = (session.model_key, session.scores, session.scores_for, session.extra.get("model_widgets"))
        try:
            model_out = _link_model(run["model"], link.dtype, session, progress)
            files = [str(link.meta_file)] + [str(link.patch_file)] * (link.patch_file is not None)  # as uploads are
            imp = _check_import(files, session)
            if imp.patch_file is not None:
                progress(0.8, desc="loading the shared edit's patches")
                edit = load_uploaded_edit(imp.meta_file, imp.patch_file, imp.handle.model, imp.meta)
                inputs, verdict = None, _linked_verdict(edit)
            else:
                edit, inputs, verdict = _import_edit(imp, progress)
                if edit is None:
                    raise UserError(verdict.strip())
        except BaseException:
            session.model_key, session.scores, session.scores_for = before[:3]
            if before[3] is None:
                session.extra.pop("model_widgets", None)
            else:
                session.extra["model_widgets"] = before[3]
            raise
        age, card = link.age_s, link.card and cards.shown(cards.StoredCard(link.card, link.made, "", ""),
                                                        "kept with the link when it was made")
    values, bench_out, restored, (forget, retain) = _restore_run(imp, edit, inputs, session, "the shared run", "link")
    k = RESTORED.index("k")
    values[k] = gr.Slider(value=values[k], maximum=num_layers(imp.handle.model))
    result = [edit_summary(edit) + data_line(session.bench_label, forget, retain), layer_table(edit),
              norms_figure(edit)]
    what = ("its card, as it was when the link was made, is under Run edit; press **Compare** for every metric"
            if card else "press **Compare** to see what it forgot and kept")
    note = (f"**Opened a shared run** (its link was made {links.age_text(age)} ago): **{imp.handle.key.shown}** on "
            f"**{session.bench_label}**. {restored} {verdict} The edit is loaded: {what}; Diagnostics and Export "
            "use it too.")
    return model_out + values + bench_out + result + [note, note, gr.Tabs(selected="edit"), card or gr.skip()]


@ui_errors
def on_open_link(link: str, session: Session, progress=gr.Progress()):
    """A link to a run (its address, or its token alone) opened in this session: the run's
    model, benchmark and split, settings, edit and result view (`LINK_OUTPUTS`); an error
    that says why when it does not open, and then nothing has changed."""
    return _open_link(link, session, progress)


def on_page_link(session: Session, request: gr.Request, progress=gr.Progress()):
    """A page opened with ?run=<token> (after its own load): that run into the page's fresh
    session (`on_open_link`). Whatever happens the page opens as usual: a link that does
    not open (not a link, unknown, expired, a model the host does not offer) is said so on
    the Edit panel's status line. Nothing at all without ?run=."""
    params = getattr(request, "query_params", None) or {}
    if links.LINK_PARAM not in params:
        return [gr.skip()] * LINK_OUTPUTS
    try:
        return on_open_link(params.get(links.LINK_PARAM), session, progress)
    except gr.Error as err:
        note = f"⚠ {err.message} The page opened as usual, on its own model and benchmark."
        return [gr.skip()] * (LINK_OUTPUTS - 4) + [note, note, gr.skip(), gr.skip()]


def build_export_panel() -> SimpleNamespace:
    text.md(text.EXPORT, elem_classes="panel-intro")
    button = gr.Button("Export the edit", variant="secondary")
    files = gr.File(label="patch.safetensors and edit.json", file_count="multiple", interactive=False)
    note = gr.Markdown("")
    code = gr.Code(language="python", label="Apply it with the library", interactive=False,
                   value=snippet(None, "grom-edit"))  # the session's model: `on_show_snippet`
    text.md(LINK_INTRO, elem_classes="panel-intro")
    with gr.Row(equal_height=True):
        link = gr.Textbox("", label="Link to this run", interactive=False, buttons=["copy"], scale=3,
                          placeholder="Press Copy link to this run", elem_id="run-link")
        link_button = gr.Button("Copy link to this run", scale=1, min_width=120, elem_id="link-button")
    link_note = gr.Markdown("", elem_id="link-note")
    text.md(text.IMPORT, elem_classes="panel-intro")
    with gr.Row(equal_height=True):
        uploads = gr.File(label="edit.json (and patch.safetensors)", file_count="multiple",
                          file_types=[".json", ".safetensors"], height=110, elem_id="import-files", scale=3)
        load = gr.Button("Load the run", scale=1, min_width=120, elem_id="import-button")
    load_note = gr.Markdown("", elem_id="import-note")
    text.md(OPEN_INTRO, elem_classes="panel-intro")
    with gr.Row(equal_height=True):
        link_in = gr.Textbox("", label="Link to a run", max_length=2000, scale=3, elem_id="open-link",
                             placeholder=f"https://…/?{links.LINK_PARAM}=…")
        open_button = gr.Button("Open the run", scale=1, min_width=120, elem_id="open-link-button")
    return SimpleNamespace(button=button, files=files, note=note, code=code, uploads=uploads, load=load,
                           load_note=load_note, link=link, link_button=link_button, link_note=link_note,
                           link_in=link_in, open=open_button)


def link_outputs(ui: SimpleNamespace) -> list:
    """What opening a link to a run sets (`LINK_OUTPUTS`, in its order): the model, the Edit
    panel's widgets, the benchmark, the result view, the notes, the tabs, the card."""
    m, b, r = ui.model, ui.bench, ui.result
    return ([m.status, m.summary, m.choice, m.device, m.dtype] + form.widgets(ui.edit, ui.layers, RESTORED)
            + [b.name, b.split, b.source, b.info, ui.data.forget_df, ui.data.retain_df, r.summary, r.table, r.norms,
               ui.edit.status, ui.export.link_note, ui.tabs, ui.edit.card])


def wire(x: SimpleNamespace, page: Page) -> None:
    """Export (public `export`), Copy link (public `make_link`, then the clipboard), Open the
    run (public `open_link`; sets `page.link_pasted`), Load the run (public `import_run`; sets
    `page.run_imported`); the code box follows the session's model and data."""
    s, ui = page.session, page.ui
    b, r = ui.bench, ui.result
    x.button.click(on_export, s, [x.files, x.note, x.code], api_name="export",  # data only: no device
                   concurrency_id="export", concurrency_limit=1)
    x.link_button.click(on_make_link, s, [x.link, x.link_note], api_name="make_link",  # written as an export is
                        concurrency_id="export", concurrency_limit=1) \
     .success(None, x.link, None, js=COPY_LINK_JS, **LOCAL)  # into the clipboard, where the browser allows it
    page.link_pasted = x.open.click(in_turn(on_open_link), [x.link_in, s], link_outputs(ui), api_name="open_link",
                                    show_progress_on=[x.link_note], **LINKS)
    restored = form.widgets(ui.edit, ui.layers, RESTORED)
    page.run_imported = x.load.click(in_turn(on_import_run), [x.uploads, s],
                                     restored + [b.name, b.split, b.source, b.info, ui.data.forget_df,
                                                 ui.data.retain_df, r.summary, r.table, r.norms, x.load_note],
                                     api_name="import_run", show_progress_on=x.load_note, **device_queue())
    # the code for the session's model and a question of its data
    for done in (page.model_loaded, page.data_loaded, *page.run_opened):
        done.success(on_show_snippet, s, x.code, **LOCAL)
