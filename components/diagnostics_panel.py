"""Diagnostics panel: the edited matrix's outputs before and after, on the directions they
moved most (a PCA of the moves), the per-example influence bars (Theorem 2) and the 4-bit
quantization check with its verdict. (Sweeps: components.sweep_panel.)"""
from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import numpy as np
import pandas as pd
import torch

from components.server.costs import check_comparison
from components.server.device import DEVICE_LOCK, give_turn, kept_cache, on_device
from components.server.durations import edit_and_report_s, rerun_s
from components.server.errors import UserError, shorten, ui_errors
from components.server.session import (
    ModelKey,
    Session,
    current_benchmark,
    current_edit,
    current_model,
    in_turn,
    resident,
)
from components.server.validate import whole_number
from components.studio.comparison import examples_per_set
from components.studio.wiring import LOCAL, Page, device_queue
from components.views import plots, text
from components.views.tables import empty_table
from grom import run_edit
from grom.closed_form.diagnostics import example_outputs, influence, movement_axes
from grom.eval import quantization_check
from grom.eval.quant_check import QUANT_KEPT, quantization_verdict
from grom.eval.report import RETAIN_BROKEN

SHOWN_POINTS = 200  # examples per side drawn (and whose moves give the axes)
TOP_BARS = 40


def _label(ex, width: int = 90) -> str:
    s = getattr(ex, "question", None) or getattr(ex, "prompt", None) or getattr(ex, "text", "")
    return s if len(s) <= width else s[: width - 1] + "…"


def _edited(edit) -> list[str]:
    """The edited matrices' parameter names (those whose keys it kept, when it kept some)."""
    return list(edit.keys) if getattr(edit, "keys", None) else list(getattr(edit, "patches", {}) or {})


def _matrix(edit, param: str | None) -> str:
    """The edited matrix `param` names: its parameter name or its short name
    ("model.layers.4.mlp.down_proj"), "" for the first one."""
    edited = _edited(edit)
    if not edited:
        raise UserError("This edit changed no matrix; run the edit again.")
    if param in (None, ""):
        return edited[0]
    names = {name: name for name in edited} | {name.replace(".weight", ""): name for name in edited}
    if param not in names:
        shown = ", ".join(name.replace(".weight", "") for name in edited)
        raise UserError(f"{shorten(param)!r} is not a matrix of this edit kept for the diagnostics; "
                        f"use one of: {shown} (or leave it empty for the first).")
    return names[param]


FIRST = ("the first edited matrix", "")


def matrix_choices(edit) -> list[tuple[str, str]]:
    return [FIRST] + ([(name.replace(".weight", ""), name) for name in _edited(edit)] if edit is not None else [])


def with_keys(key: ModelKey, edit, inputs):
    """`edit` made again with its keys kept (a session keeps only the patches: the keys of
    a band are hundreds of MB): the same config, band and examples, so the same patches.
    Call with DEVICE_LOCK held."""
    if edit.keys:
        return edit
    if inputs is None:
        raise UserError("This session no longer holds the examples of its edit; press Run edit again.")
    handle = resident(key, "request")
    forget, retain = inputs
    config = edit.settings.replace(keep_keys=True, layers=tuple(edit.band) or None)
    return run_edit(handle.model, handle.tokenizer, forget, retain, config,
                    scores=edit.scores, stream_cache=kept_cache(handle.stream_cache), between=give_turn,
                    progress=False)  # a server draws no terminal bar for a visitor's diagnostics


# ---------------------------------------------------------------- where the outputs moved

@on_device(duration=rerun_s)
def _outputs(key: ModelKey, edit, inputs, param: str):
    with DEVICE_LOCK:  # W is read from the shared model: no edit may be applied meanwhile
        full = with_keys(key, edit, inputs)
        return example_outputs(full, resident(key, "request").model, param)


def project(outputs, shown: int = SHOWN_POINTS):
    """The outputs W x and (W + P) x of at most `shown` forget and `shown` retain examples
    (seeded sample; examples without keys dropped), placed on the two directions along
    which they moved most (`grom.closed_form.diagnostics.movement_axes` of the drawn examples'
    displacements), with the mean of the outputs before the edit at the origin. Returns
    the projected points, each axis's share of the movement and the drawn indices."""
    parts = {"forget_before": outputs.forget_before, "forget_after": outputs.forget_after,
             "retain_before": outputs.retain_before, "retain_after": outputs.retain_after}
    arrays = {k: v.double() for k, v in parts.items()}
    rng = np.random.default_rng(0)
    keep = {}
    for side in ("forget", "retain"):
        ok = np.where(torch.isfinite(arrays[f"{side}_before"]).all(1).numpy())[0]
        keep[side] = np.sort(rng.choice(ok, size=min(shown, len(ok)), replace=False))
    if min(len(k) for k in keep.values()) < 2:
        raise UserError("Too few examples with keys to draw; use a larger forget or retain set.")
    arrays = {k: v[torch.as_tensor(keep[k.split("_")[0]])] for k, v in arrays.items()}
    moves = torch.cat([arrays[f"{side}_after"] - arrays[f"{side}_before"] for side in ("forget", "retain")])
    try:
        axes, share = movement_axes(moves, 2)
    except ValueError as err:
        raise UserError(f"{err}; raise β (or c) and run the edit again.") from err
    if axes.shape[0] < 2:
        raise UserError("Too few examples with keys to draw; use a larger forget or retain set.")
    origin = torch.cat([arrays["forget_before"], arrays["retain_before"]]).mean(0)
    points = {k: ((v - origin) @ axes.T).numpy() for k, v in arrays.items()}
    return points, share.tolist(), keep


def relative_move(before, after) -> float:
    """Mean ||(W + P) x - W x|| / ||W x|| over the examples with keys."""
    b, a = before.double(), after.double()
    ok = torch.isfinite(b).all(1)
    return float(((a[ok] - b[ok]).norm(dim=1) / b[ok].norm(dim=1).clamp_min(1e-12)).mean())


def pca_note(param: str, moved: dict, share: list, ratio: float) -> str:
    """What the movement plot shows, in words: the share of each set's output norm that
    moved, and why a patch of ‖P‖/‖W‖ = `ratio` moves the retain outputs so little."""
    times = moved["forget"] / max(moved["retain"], 1e-12)
    return (f"`{param.replace('.weight', '')}`: the axes are the two directions along which the "
            f"outputs moved most ({share[0] + share[1]:.0%} of all the movement). The edit moved the "
            f"**forget** outputs by **{moved['forget']:.1%}** of their norm on average and the **retain** "
            f"outputs by **{moved['retain']:.1%}** ({times:.1f}× less).  \n"
            f"‖P‖/‖W‖ = {ratio:.0%} compares the patch with the whole matrix (Frobenius norms, over "
            "every input direction). An input feels only the part of P along its own direction, and P "
            "was solved to act where the forget keys lie; the movements above are what each set felt.")


@ui_errors
def on_pca(param: str, session: Session):
    """W x (hollow) and (W + P) x (filled) per forget and retain example, on the two
    directions of largest movement, and a note of how far each set moved."""
    handle = current_model(session)
    edit = current_edit(session)
    param = _matrix(edit, param)
    outputs = _outputs(handle.key, edit, session.extra.get("edit_inputs"), param)
    points, share, keep = project(outputs)
    forget, retain = session.extra.get("edit_inputs", ((), ()))
    labels = {"forget": [_label(forget[i]) for i in keep["forget"]] if forget else [],
              "retain": [_label(retain[i]) for i in keep["retain"]] if retain else []}
    moved = {side: relative_move(getattr(outputs, f"{side}_before"), getattr(outputs, f"{side}_after"))
             for side in ("forget", "retain")}
    record = next(r for r in edit.layers if r.param_name == param)
    ratio = record.patch_norm / max(record.weight_norm, 1e-12)
    return plots.plot_pca(points, share, labels), pca_note(param, moved, share, ratio)


# ---------------------------------------------------------------- influence

@on_device(duration=rerun_s)
def _influence(key: ModelKey, edit, inputs, param: str):
    with DEVICE_LOCK:
        full = with_keys(key, edit, inputs)
    return influence(full, param).numpy()


def influence_frame(shares: np.ndarray, forget) -> pd.DataFrame:
    order = np.argsort(-shares)
    return pd.DataFrame({"rank": np.arange(1, len(order) + 1), "share of ‖P‖": [f"{shares[i]:.2%}" for i in order],
                         "example": [_label(forget[i]) if forget else str(i) for i in order]})


def example_md(shares: np.ndarray, forget, rank: int) -> str:
    order = np.argsort(-shares)
    if not 1 <= rank <= len(order):
        raise UserError(f"Rank {rank} is out of range: pick 1 to {len(order)}.")
    i = int(order[rank - 1])
    ex = forget[i] if forget else None
    body = ""
    if ex is not None:
        q = getattr(ex, "question", None) or getattr(ex, "prompt", None)
        body = (f"**Q:** {q}  \n**A:** {getattr(ex, 'answer', '')}" if q else f"{ex.text[:600]}")
    return (f"**Rank {rank}**, forget example {i}: removing it changes P by "
            f"**{shares[i]:.2%}** of ‖P‖.  \n{body}")


def shares_md(shares: np.ndarray, top: int = TOP_BARS) -> str:
    """The line under the bars: what the shares add up to, and why not to 100%."""
    shares = np.asarray(shares, float)
    n = len(shares)
    if n == 1:
        return (f"One forget example: leaving it out leaves no patch at all, a change of "
                f"**{shares[0]:.0%}** of ‖P‖.")
    drawn = f" (the largest {top} drawn)" if n > top else ""
    return (f"The {n} bars{drawn} add up to **{shares.sum():.0%}** of ‖P‖, not 100%: each is one "
            f"example left out alone, and the examples' changes point in different directions, so "
            f"their sizes do not add up to the size of P. Their squares add up to "
            f"{(shares ** 2).sum():.0%} (for changes at right angles that together make up P they "
            f"would add up to exactly 100%, as 3² + 4² = 5²).")


@ui_errors
def on_influence(param: str, session: Session):
    """Per-example influence ||P - P_-i|| / ||P|| (sorted bars named by their questions, the
    table, and under the bars the sum of the shares then the largest example)."""
    handle = current_model(session)
    edit = current_edit(session)
    param = _matrix(edit, param)
    norms = _influence(handle.key, edit, session.extra.get("edit_inputs"), param)
    record = next(r for r in edit.layers if r.param_name == param)
    shares = norms / max(record.patch_norm, 1e-30)
    forget = session.extra.get("edit_inputs", ((), ()))[0]
    session.influence = (param, shares)
    labels = [_label(forget[i]) if forget else str(i) for i in range(len(shares))]
    return (plots.plot_influence(shares, labels, top=TOP_BARS), influence_frame(shares, forget),
            f"{shares_md(shares)}\n\n{example_md(shares, forget, 1)}")


@ui_errors
def on_influence_example(rank: int, session: Session):
    """The forget example at `rank` of the last influence audit (1 = the largest)."""
    if session.influence is None:
        raise UserError("Press Influence first.")
    param, shares = session.influence
    forget = session.extra.get("edit_inputs", ((), ()))[0]
    rank = whole_number(rank, "rank", 1, len(shares))
    labels = [_label(forget[i]) if forget else str(i) for i in range(len(shares))]
    return (f"{shares_md(shares)}\n\n{example_md(shares, forget, rank)}",
            plots.plot_influence(shares, labels, top=max(TOP_BARS, rank), selected=rank - 1))


def on_table_select(evt: gr.SelectData, session: Session):
    """Clicking a row of the influence table shows that example."""
    row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    return on_influence_example(int(row) + 1, session)


# ---------------------------------------------------------------- quantization

@on_device(duration=edit_and_report_s)
def _quant(key: ModelKey, bench, edit, n):
    with DEVICE_LOCK:
        handle = resident(key, "request")
        return quantization_check(handle.model, handle.tokenizer, bench, edit, max_examples=n,
                                  with_retain=True, between=give_turn)  # a visitor waiting goes between batches


@ui_errors
def on_quant_check(max_examples: int, full_set: bool, session: Session):
    """Forget metrics at full precision and 4-bit, base and edited, on the examples the
    comparison uses (its Examples per set and 'all examples'): the Base and Edited
    columns are then the comparison's own numbers."""
    handle = current_model(session)
    edit = current_edit(session)
    bench = current_benchmark(session)
    n = examples_per_set(max_examples, full_set, bench)
    check_comparison(handle.tokenizer, bench, n, "This quantization check")
    df = _quant(handle.key, bench, edit, n)
    method = (f"round-to-nearest, group size {df.attrs['group_size']}" if df.attrs.get("method") == "rtn"
              else "NF4 (bitsandbytes)")
    if df.attrs.get("method") == "rtn" and "cannot run" in df.attrs.get("quantizer_reason", ""):
        method += f"; {df.attrs['quantizer_reason'].split(': ', 1)[-1]}"  # why not NF4
    # metrics as rows, the four models as columns: narrow enough for the panel
    out = df.T.astype(float).round(3).reset_index(names="metric")
    out.columns = ["metric"] + [c.split(",")[0] + (" 4-bit" if "4-bit" in c else "") for c in df.index]
    size = "every example" if n is None else f"{n} examples per set"
    return out, f"{quant_verdict_md(df)}  \n4-bit: {method}; {size}, as in Compare."


def quant_verdict_md(df: pd.DataFrame) -> str:
    """One line: does the edit survive 4-bit quantization, and the numbers behind it."""
    v = quantization_verdict(df)
    if v.survives is None:
        return (f"**No verdict**: at full precision the edit moved {v.forget_metric} too little to "
                "tell whether 4 bits undo it; raise β and run the edit again.")
    forget = (f"{v.forget_kept:.0%} of the drop in {v.forget_metric} remains at 4 bits "
              f"(needed: {QUANT_KEPT:.0%})")
    retain = ("" if v.retain_metric is None else
              f"; {v.retain_metric} loses {v.retain_lost:.0%} against the base model at 4 bits "
              f"(allowed: {RETAIN_BROKEN:.0%})")
    head = ("✔ **The edit survives 4-bit quantization**" if v.survives else
            "⚠ **The edit does not survive 4-bit quantization**")
    return f"{head}: {forget}{retain}."


def build_diagnostics_panel() -> SimpleNamespace:
    text.md(text.DIAGNOSTICS, elem_classes="panel-intro")
    # custom values: a script through the API names a matrix the browser's choices never listed
    matrix = gr.Dropdown([FIRST], value="", label="Edited matrix to inspect", allow_custom_value=True)
    with gr.Accordion("Where the outputs moved (before and after the edit)", open=True):
        text.md(text.PCA)
        pca_btn = gr.Button("Draw", size="sm", elem_id="pca-button")
        pca = gr.Plot(plots.empty_figure("Run an edit, then Draw."), show_label=False, elem_id="pca-plot")
        pca_note = gr.Markdown("")
    with gr.Accordion("Per-example influence", open=True):
        text.md(text.INFLUENCE)
        infl_btn = gr.Button("Influence", size="sm")
        infl_plot = gr.Plot(plots.empty_figure("Run an edit, then Influence."), show_label=False)
        infl_example = gr.Markdown("", elem_id="influence-example")  # the sum of the bars, then one example
        with gr.Row(equal_height=True):
            rank = gr.Number(value=1, label="Show the example at rank", scale=3, min_width=120)
            show = gr.Button("Show", size="sm", scale=1, min_width=80)  # the rank is checked by the handler
        infl_table = gr.Dataframe(empty_table("influence"), label="Forget examples by influence (click a row)",
                                  interactive=False,
                                  max_height=300, wrap=True, column_widths=["15%", "20%", "65%"],
                                  elem_id="influence-table")
        with gr.Accordion("The math: Theorem 2", open=False):
            text.md(text.INFLUENCE_MATH, elem_classes="math")
    with gr.Accordion("4-bit quantization check", open=False):
        text.md(text.QUANT)
        quant_btn = gr.Button("Check", size="sm", elem_id="quant-button")
        quant_note = gr.Markdown("", elem_id="quant-note")
        quant_table = gr.Dataframe(empty_table("quantization"), interactive=False, wrap=True, elem_id="quant-table")
    return SimpleNamespace(matrix=matrix, pca_btn=pca_btn, pca=pca, pca_note=pca_note,
                           infl_btn=infl_btn, infl_plot=infl_plot, infl_table=infl_table, rank=rank,
                           show=show, infl_example=infl_example, quant_btn=quant_btn,
                           quant_table=quant_table, quant_note=quant_note)


def wire(d: SimpleNamespace, page: Page) -> None:
    """PCA (public `pca`), influence (public `influence`, `influence_example`, a row), the 4-bit
    check (public `quantization`, on the Compare panel's example count)."""
    s, c = page.session, page.ui.compare
    d.pca_btn.click(in_turn(on_pca), [d.matrix, s], [d.pca, d.pca_note], api_name="pca", **device_queue())
    d.infl_btn.click(in_turn(on_influence), [d.matrix, s], [d.infl_plot, d.infl_table, d.infl_example],
                     api_name="influence", **device_queue())
    d.show.click(on_influence_example, [d.rank, s], [d.infl_example, d.infl_plot], api_name="influence_example")
    d.infl_table.select(on_table_select, s, [d.infl_example, d.infl_plot], **LOCAL)
    d.quant_btn.click(in_turn(on_quant_check), [c.max_examples, c.full_set, s], [d.quant_table, d.quant_note],
                      api_name="quantization", **device_queue())
