"""Pure plotly builders: data in, `go.Figure` out. No model, no gradio, no state.

Colours: forget is warm (orange), retain cool (blue), the band and highlights violet.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

FORGET, RETAIN, ACCENT, MUTED = "#e8590c", "#1c7ed6", "#7048e8", "#adb5bd"
FONT = dict(family="Inter, system-ui, sans-serif", size=13)


MODEBAR_PX = 34
"""Room for plotly's toolbar (the modebar) above a title: it appears at the figure's top
right on hover, and on a phone, where a tap is a hover, over a title that runs that far
(at 390 px, most of them). Measured in chromium: its buttons end 30 px below the figure's
top."""


def _layout(fig: go.Figure, title: str, height: int = 360, **kw) -> go.Figure:
    """A figure's common layout: its title at the top left, set below the toolbar's strip
    (`MODEBAR_PX`) so that the toolbar never covers it, whatever the width; a `margin`
    given keeps at least the room for the strip and the title's lines."""
    base = dict(title=dict(text=title, x=0.01, xanchor="left", y=1, yref="container", yanchor="top",
                           pad=dict(t=MODEBAR_PX), font=dict(size=15)), height=height,
                margin=dict(l=50, r=20, t=48, b=44), font=FONT, template="plotly_white",
                legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1))
    layout = base | kw
    if title:  # 20 px a line of the title
        room = MODEBAR_PX + 20 * (title.count("<br>") + 1)
        layout["margin"] = dict(layout["margin"], t=max(layout["margin"].get("t", 0), room))
    fig.update_layout(**layout)
    return fig


def empty_figure(message: str, height: int = 300) -> go.Figure:
    """A blank figure that says what to do to fill it."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#868e96"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, "", height)


def plot_layer_scores(S: Sequence[float], F: Sequence[float], R: Sequence[float],
                      band: Sequence[int], *, show_parts: bool = False,
                      suggested: Sequence[int] | None = None) -> go.Figure:
    """Bars of S_l = F_l - R_l per layer, the band's bars in the accent colour and shaded;
    F_l and R_l on hover, or, when `show_parts`, as lines in a panel of their own below
    (they are an order of magnitude larger than S_l: on one axis S_l would lie flat)."""
    layers = list(range(len(S)))
    band = set(band)
    colours = [ACCENT if l in band else MUTED for l in layers]
    custom = np.stack([np.asarray(F, float), np.asarray(R, float)], axis=1)
    fig = (make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.6, 0.4])
           if show_parts else go.Figure())
    at = dict(row=1, col=1) if show_parts else {}
    fig.add_trace(go.Bar(
        x=layers, y=list(S), marker_color=colours, name="S<sub>l</sub> = F<sub>l</sub> − R<sub>l</sub>",
        customdata=custom,
        hovertemplate="layer %{x}<br>S = %{y:.4g}<br>F = %{customdata[0]:.4g}"
                      "<br>R = %{customdata[1]:.4g}<extra></extra>"), **at)
    for part, ref in ((band, None), (suggested, "suggested")):
        if not part or (ref and set(part) == band):
            continue
        style = (dict(fillcolor=ACCENT, opacity=0.08, line_width=0, annotation_text="band",
                      annotation_position="top left") if ref is None else
                 dict(line=dict(color=ACCENT, dash="dot", width=1), fillcolor="rgba(0,0,0,0)",
                      annotation_text="suggested", annotation_position="bottom right"))
        fig.add_vrect(x0=min(part) - 0.5, x1=max(part) + 0.5, **style, **at)
    if show_parts:
        for values, name, colour in ((F, "F<sub>l</sub> (forget)", FORGET),
                                     (R, "R<sub>l</sub> (retain)", RETAIN)):
            fig.add_trace(go.Scatter(x=layers, y=list(values), mode="lines+markers", name=name,
                                     line=dict(color=colour), marker=dict(size=5)), row=2, col=1)
        fig.update_yaxes(title="F<sub>l</sub>, R<sub>l</sub>", zeroline=True, zerolinecolor="#ced4da",
                         row=2, col=1)
    # every layer labelled on a small model; on a deep one plotly thins the labels to the
    # plot's width (30 labels overlap on a phone), the hover still names each layer
    ticks = dict(tickmode="linear", dtick=1) if len(layers) <= 16 else dict(tickmode="auto")
    fig.update_xaxes(**ticks, tickfont=dict(size=11 if len(layers) > 20 else 13),
                     range=[-0.6, len(layers) - 0.4])  # the lines' panel has no bar padding of its own
    fig.update_xaxes(title="layer", row=2 if show_parts else None, col=1 if show_parts else None)
    fig.update_yaxes(title="S<sub>l</sub>", zeroline=True, zerolinecolor="#ced4da", **at)
    below = dict(legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="center", x=0.5),
                 margin=dict(l=50, r=20, t=48, b=90)) if show_parts else {}  # clear of the title on a phone
    return _layout(fig, "Layer scores S<sub>l</sub> (the band is edited)", height=500 if show_parts else 360,
                   showlegend=show_parts, bargap=0.15 if len(layers) > 20 else None, **below)


def plot_patch_norms(labels: Sequence[str], norms: Sequence[float],
                     relative: Sequence[float]) -> go.Figure:
    """||P||_F per edited matrix, with ||P|| / ||W|| on hover."""
    fig = go.Figure(go.Bar(x=list(labels), y=list(norms), marker_color=ACCENT,
                           customdata=np.asarray(relative, float),
                           hovertemplate="%{x}<br>‖P‖ = %{y:.4g}<br>‖P‖/‖W‖ = %{customdata:.3%}"
                                         "<extra></extra>"))
    fig.update_yaxes(title="‖P‖ (Frobenius)")
    return _layout(fig, "Patch norm per edited matrix", height=260)


def plot_pca(points: dict[str, np.ndarray], explained: Sequence[float],
             labels: dict[str, Sequence[str]] | None = None) -> go.Figure:
    """Outputs placed on the two directions along which they moved most: keys
    "forget_before", "forget_after", "retain_before", "retain_after", each (N, 2) or wider
    (the first two columns are drawn); `explained`: each direction's share of the movement.
    Hollow before, filled after, a thin line from each example's before to its after."""
    labels = labels or {}
    fig = go.Figure()
    for part, colour in (("retain", RETAIN), ("forget", FORGET)):  # forget drawn on top
        B, A = (np.asarray(points[f"{part}_{w}"], float) for w in ("before", "after"))
        xs, ys = ([v for b, a in zip(B[:, i], A[:, i]) for v in (b, a, None)] for i in range(2))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{part} moves", showlegend=False,
                                 line=dict(color=colour, width=1), opacity=0.35, hoverinfo="skip"))
        text = list(labels.get(part, [])) or None
        for when, P, symbol in (("before", B, "circle-open"), ("after", A, "circle")):
            fig.add_trace(go.Scatter(
                x=P[:, 0], y=P[:, 1], mode="markers", name=f"{part}, {when}",
                marker=dict(size=7 if when == "before" else 6, color=colour, symbol=symbol,
                            opacity=0.9 if when == "after" else 0.6, line=dict(width=1, color=colour)),
                text=text, hovertemplate="%{text}<extra>" + f"{part}, {when}</extra>" if text else None))
    ev = [f"movement direction {i + 1} ({e:.0%} of the movement)" for i, e in enumerate(explained)]
    fig.update_xaxes(title=ev[0], zeroline=False)
    fig.update_yaxes(title=ev[1], zeroline=False, scaleanchor="x", scaleratio=1)
    return _layout(fig, "W x (hollow) → (W + P) x (filled)", height=480,
                   margin=dict(l=50, r=10, t=70, b=44))


def tick_label(label: str, width: int = 32) -> str:
    """`label` on one line and at most `width` characters (an ellipsis where cut): an axis
    label; the whole text goes in the hover."""
    label = " ".join(str(label).split())
    return label if len(label) <= width else label[: width - 1].rstrip() + "…"


def plot_influence(shares: Sequence[float], labels: Sequence[str], *, top: int = 40,
                   selected: int | None = None) -> go.Figure:
    """The `top` largest per-example influences ||P - P_-i|| / ||P||, sorted, each bar
    labelled with its example (`labels`: the questions; cut short on the axis, whole on
    hover), the largest (or the `selected` rank) marked."""
    shares = np.asarray(shares, float)
    order = np.argsort(-shares, kind="stable")[:top]
    mark = 0 if selected is None else selected
    colours = [ACCENT if rank == mark else FORGET for rank in range(len(order))]
    # positions, not the labels, on the axis: two questions cut to the same text stay two bars
    fig = go.Figure(go.Bar(
        x=list(range(len(order))), y=shares[order], marker_color=colours,
        customdata=[labels[i] for i in order], hovertext=[f"rank {r + 1}" for r in range(len(order))],
        hovertemplate="%{hovertext}: leaving it out changes P by %{y:.1%} of ‖P‖<br>%{customdata}"
                      "<extra></extra>"))
    if len(order):
        fig.add_annotation(x=mark, y=float(shares[order[mark]]), text="largest" if mark == 0
                           else "selected", showarrow=True, arrowhead=2, ay=-30)
    fig.update_yaxes(title="change of P without it, share of ‖P‖", tickformat=".0%", title_font_size=12)
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(order))),
                     ticktext=[tick_label(labels[i]) for i in order], tickangle=-60,
                     tickfont=dict(size=10 if len(order) > 20 else 11), range=[-0.6, len(order) - 0.4])
    return _layout(fig, "Per-example influence ‖P − P₋ᵢ‖ / ‖P‖ (Theorem 2)", height=470,
                   margin=dict(l=100, r=20, t=48, b=190))  # l: room for the first labels, slanted left


def plot_sweep(labels: Sequence[str], forget: Sequence[float], retain: Sequence[float],
               forget_set: str, retain_set: str, current: int | None = None) -> go.Figure:
    """One point per sweep value (index 0: the unedited model, a grey star): the mean
    p(gold answer) on the forget set against that on the retain set; `current` (an index)
    ringed. Good points sit top left: forgotten, kept."""
    labels, forget, retain = list(labels), list(forget), list(retain)
    fig = go.Figure(go.Scatter(
        x=forget[1:], y=retain[1:], mode="lines+markers+text", text=labels[1:], textposition="top center",
        marker=dict(size=11, color=ACCENT), line=dict(color=MUTED), name="edits",
        hovertemplate="%{text}<br>forget p %{x:.3f}<br>retain p %{y:.3f}<extra></extra>"))
    if forget:
        fig.add_trace(go.Scatter(x=forget[:1], y=retain[:1], mode="markers+text", text=labels[:1],
                                 textposition="bottom left", name="unedited",
                                 marker=dict(size=14, symbol="star", color=MUTED)))
    if current is not None and 0 < current < len(forget):
        fig.add_trace(go.Scatter(x=[forget[current]], y=[retain[current]], mode="markers", name="current edit",
                                 marker=dict(size=20, color="rgba(0,0,0,0)", line=dict(color=FORGET, width=3))))
    fig.update_xaxes(title=f"{forget_set}: mean p(gold answer) ↓", rangemode="tozero")
    fig.update_yaxes(title=f"{retain_set}: mean p(gold answer) ↑", rangemode="tozero")
    return _layout(fig, "Sweep (top left is best)", height=380, showlegend=False)


def plot_tradeoff(forget: Sequence[float], kept: Sequence[float], labels: Sequence[str], *,
                  x_title: str, y_title: str, others: Sequence[bool] | None = None,
                  latest: int | None = -1, note: str = "") -> go.Figure:
    """The run history's trade-off: one point per compared run, numbered; `latest` (an
    index, None: none) ringed as the latest run, and `note` under the title (where the
    latest run is no point); `others` marks the points of other methods than GROM
    (baselines, editors: orange diamonds; GROM's: violet dots)."""
    forget, kept, labels = list(forget), list(kept), list(labels)
    others = list(others) if others is not None else [False] * len(forget)
    # runs of nearby settings land on one spot: a number on every point would overlap, so only
    # the latest is numbered and every point names its run on hover
    fig = go.Figure(go.Scatter(
        x=forget, y=kept, mode="markers", customdata=labels,
        marker=dict(size=12, opacity=0.7, color=[FORGET if o else ACCENT for o in others],
                    symbol=["diamond" if o else "circle" for o in others]),
        hovertemplate="%{customdata}<br>forget %{x:.3f}<br>kept %{y:.3f}<extra></extra>"))
    if forget and latest is not None:
        i = latest % len(forget)
        fig.add_trace(go.Scatter(x=[forget[i]], y=[kept[i]], mode="markers+text", name="latest",
                                 text=[f"latest: {labels[i].split(':')[0]}"], textposition="top center",
                                 hoverinfo="skip",
                                 marker=dict(size=22, color="rgba(0,0,0,0)", line=dict(color=FORGET, width=3))))
    fig.update_xaxes(title=x_title, range=[-0.05, 1.05])
    fig.update_yaxes(title=y_title, range=[-0.05, 1.1])
    title = "Runs (top left is best)" + (f"<br><sup>{note}</sup>" if note else "")
    return _layout(fig, title, height=340, showlegend=False)


def plot_attacks(attacks: Sequence[str], recall: dict[str, Sequence[float]]) -> go.Figure:
    """Grouped bars: fact recall on the held-out probes under each attack (x), one bar per
    model (`recall`: name -> one value per attack, NaN where it did not run; "Base" first,
    in grey). Lower is better for an unlearned model; the base model's bar is what there
    was to forget."""
    fig = go.Figure()
    palette = [ACCENT, FORGET, RETAIN, "#2b8a3e", "#f08c00", "#862e9c"]
    for i, (name, values) in enumerate(recall.items()):
        colour = MUTED if name == "Base" else palette[(i - ("Base" in recall)) % len(palette)]
        fig.add_trace(go.Bar(x=list(attacks), y=list(values), name=name, marker_color=colour,
                             hovertemplate=f"{name}<br>%{{x}}: recall %{{y:.2f}}<extra></extra>"))
    fig.update_yaxes(title_text="fact recall on held-out probes", range=[0, 1.05])
    fig.update_xaxes(tickangle=-30)
    return _layout(fig, "Recall under each attack (lower: forgotten)", 380, barmode="group",
                   margin=dict(l=56, r=20, t=56, b=96))


def plot_logit_lens(layers: Sequence[int], prob: dict[str, Sequence[float]], band: Sequence[int],
                    first_changed: int | None = None) -> go.Figure:
    """The answer's probability read from the residual stream at each layer's output (the
    logit lens), one line per model; the edited band shaded, and the layers below the
    first changed weight labelled as untouched by construction."""
    fig = go.Figure()
    colours = {"Base": MUTED}
    for i, (name, values) in enumerate(prob.items()):
        fig.add_trace(go.Scatter(x=list(layers), y=list(values), mode="lines+markers", name=name,
                                 line=dict(color=colours.get(name, [ACCENT, FORGET, RETAIN][i % 3]), width=2),
                                 hovertemplate=f"{name}<br>layer %{{x}}: p %{{y:.3f}}<extra></extra>"))
    _shade_layers(fig, band, first_changed)
    fig.update_xaxes(title_text="layer (its output read through the final norm and head)")
    fig.update_yaxes(title_text="probability of the answer's fact token")
    return _layout(fig, "Where the answer still lives: the logit lens", 340)


def _shade_layers(fig: go.Figure, band: Sequence[int], first_changed: int | None) -> None:
    """A per-layer plot's edited band shaded, and the layers below the first changed weight
    labelled as untouched by construction."""
    if band:
        fig.add_vrect(x0=min(band) - 0.5, x1=max(band) + 0.5, fillcolor=ACCENT, opacity=0.1, line_width=0,
                      annotation_text="edited band", annotation_position="top left")
    if first_changed:
        fig.add_vrect(x0=-0.5, x1=first_changed - 0.5, fillcolor=MUTED, opacity=0.12, line_width=0,
                      annotation_text="untouched by construction", annotation_position="top right")


def plot_depth(layers: Sequence[int], share: dict[str, Sequence[float | None]], band: Sequence[int],
               first_changed: int | None = None, with_retain: bool = False) -> go.Figure:
    """The depth score per layer (`grom.robustness.depth`): how much of the forgotten facts
    each layer's states have lost when patched into the unedited model (0: it reads them
    back; 1: gone there), one line per method; against a retain model's states (UDS's layer
    erasure ratio) or, without one, against the edit's own fall at the output."""
    fig = go.Figure()
    for i, (name, values) in enumerate(share.items()):
        y = [math.nan if v is None else v for v in values]
        fig.add_trace(go.Scatter(x=list(layers), y=y, mode="lines+markers", name=name,
                                 line=dict(color=[ACCENT, FORGET, RETAIN][i % 3], width=2),
                                 hovertemplate=f"{name}<br>layer %{{x}}: erased %{{y:.2f}}<extra></extra>"))
    _shade_layers(fig, band, first_changed)
    fig.update_xaxes(title_text="layer (its states patched in)")
    fig.update_yaxes(title_text="erased (vs retain model)" if with_retain else "erased (vs the output)",
                     range=[-0.05, 1.05])
    return _layout(fig, "Where it is still recoverable: depth by patching", 340)


def _cell_text(counts: dict, names: Sequence[tuple[str, str, bool]], reading: str) -> str:
    """A landscape cell's counts, one line a set: "fitted gone 12/15" or "kept 60/64"
    (held or not by `reading`)."""
    col = 1 if reading == "stated" else 2
    lines = []
    for label, name, gone in names:
        group = [counts[n] for n in (name if isinstance(name, tuple) else (name,)) if n in counts]
        if group:
            read, held = sum(g[0] for g in group), sum(g[col] for g in group)
            lines.append(f"{label} {read - held if gone else held}/{read}")
    return "<br>".join(lines)


def plot_landscape_map(strengths: Sequence[float], w_rs: Sequence[float], cells: dict, *, strength: str,
                       forget: str, forget_label: str, kept: tuple[str, ...], reading: str,
                       current: tuple[float, float] | None = None, front: Sequence[tuple[float, float]] = (),
                       title: str = "") -> go.Figure:
    """The grid as a map: one square per (strength, w_r), coloured by the share of `forget`'s
    facts gone (no longer held by `reading`), each with its sets' counts of facts still held
    (fitted, held-out, kept); a cell not computed yet is blank; `current` outlined (you are
    here), the cells of the Pareto front starred, and the forget side's "words kept" (the
    unedited answers' other tokens still the first pick: it falls as the text breaks, which a
    reading counts as gone). cells: {(strength, w_r): grom.landscape.Cell}.
    customdata "strength,w_r" per square (a click restores it)."""
    xs, ys = [f"{v:g}" for v in strengths], [f"{v:g}" for v in w_rs]
    z, text, custom = [], [], []
    shown = (("fitted gone", "forget", True), ("held-out gone", "probes", True), ("kept", tuple(kept), False))
    for w in w_rs:
        row_z, row_t, row_c = [], [], []
        for s in strengths:
            cell = cells.get((s, w))
            lost = cell.lost(forget, reading) if cell is not None else None
            row_z.append(lost)
            star = "★ " if (s, w) in set(front) else ""
            words = cell.words_kept(("forget", "probes")) if cell is not None else None
            row_t.append("…" if cell is None else star + _cell_text(cell.counts, shown, reading)
                         + ("" if words is None else f"<br>words kept {words:.0%}"))
            row_c.append(f"{s:g},{w:g}")
        z.append(row_z)
        text.append(row_t)
        custom.append(row_c)
    # squares at integer places, labelled with the values (a numeric axis would space them by value)
    fig = go.Figure(go.Heatmap(
        x=list(range(len(xs))), y=list(range(len(ys))), z=z, text=text, customdata=custom, texttemplate="%{text}",
        textfont=dict(size=10), zmin=0, zmax=1, colorscale=[[0, "#f8f9fa"], [1, FORGET]], xgap=2, ygap=2,
        colorbar=dict(title=dict(text=f"{forget_label}<br>gone", side="top"), thickness=10, len=0.9),
        hovertemplate="%{customdata} (" + strength + ", w_r)<br>%{text}<extra>click: put it in the Edit form</extra>"))
    if current is not None and current[0] in strengths and current[1] in w_rs:
        i, j = list(strengths).index(current[0]), list(w_rs).index(current[1])
        fig.add_shape(type="rect", x0=i - 0.5, x1=i + 0.5, y0=j - 0.5, y1=j + 0.5, xref="x", yref="y",
                      line=dict(color=ACCENT, width=4))
    fig.update_xaxes(title=f"{strength} (forgets harder →)", tickvals=list(range(len(xs))), ticktext=xs,
                     showgrid=False, zeroline=False)
    fig.update_yaxes(title="w_r (keeps more ↑)", tickvals=list(range(len(ys))), ticktext=ys, showgrid=False,
                     zeroline=False)
    title = (title or "The trade-off, cell by cell") + ("<br><sup>outlined: you are here · ★ the Pareto front</sup>"
                                                         if current is not None or front else "")
    return _layout(fig, title, height=450)


def plot_landscape_front(points: Sequence[tuple[float, float]], labels: Sequence[str], keys: Sequence[str], *,
                         front: Sequence[int], forget_label: str, current: int | None = None,
                         preview: tuple[float, float, str] | None = None) -> go.Figure:
    """Each computed cell as a point (retain cost, forgetting): up and left is better; the
    Pareto front (`front`, indices) joined; `current` ringed (you are here); `preview`
    (cost, forgetting, label), a settings' preview not yet run, as a hollow diamond.
    customdata: each point's "strength,w_r" (a click restores it)."""
    cost, gone = [p[0] for p in points], [p[1] for p in points]
    fig = go.Figure(go.Scatter(
        x=cost, y=gone, mode="markers", customdata=list(keys), text=list(labels), name="cells",
        marker=dict(size=10, color=ACCENT, opacity=0.55),
        hovertemplate="%{text}<br>retain cost %{x:.0%}<br>gone %{y:.0%}<extra>click: put in the Edit form</extra>"))
    if front:
        order = sorted(front, key=lambda i: (cost[i], gone[i]))
        fig.add_trace(go.Scatter(x=[cost[i] for i in order], y=[gone[i] for i in order], mode="lines+markers",
                                 customdata=[keys[i] for i in order], text=[labels[i] for i in order],
                                 name="Pareto front", line=dict(color=FORGET, width=2),
                                 marker=dict(size=12, color=FORGET, symbol="star"),
                                 hovertemplate="%{text}<br>on the front<extra></extra>"))
    if current is not None and 0 <= current < len(points):
        fig.add_trace(go.Scatter(x=[cost[current]], y=[gone[current]], mode="markers+text", text=["you are here"],
                                 textposition="bottom right", customdata=[keys[current]], name="you are here",
                                 marker=dict(size=22, color="rgba(0,0,0,0)", line=dict(color=ACCENT, width=3)),
                                 hoverinfo="skip"))
    if preview is not None:
        fig.add_trace(go.Scatter(x=[preview[0]], y=[preview[1]], mode="markers+text", text=[preview[2]],
                                 textposition="top right", name="preview", hoverinfo="skip",
                                 marker=dict(size=16, symbol="diamond-open", color=RETAIN, line=dict(width=3))))
    fig.update_xaxes(title="retain cost: kept facts no longer held →", tickformat=".0%", rangemode="tozero")
    fig.update_yaxes(title=f"{forget_label} facts gone ↑", tickformat=".0%", range=[-0.03, 1.03])
    return _layout(fig, "Forgetting against retain cost<br><sup>up and left is better</sup>", height=430,
                   showlegend=False)
