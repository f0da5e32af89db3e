"""Pure table and text builders: the metrics table and its formatting, the per-matrix
table of an edit, a benchmark's examples and description."""
from __future__ import annotations

import html

import gradio as gr
import pandas as pd

from components.views import plots
from grom.eval import DIRECTION


def layer_table(edit) -> pd.DataFrame:
    """One row per edited matrix: its patch norm, the beta and mu used, the key counts."""
    def name(r):
        kind = edit.matrix
        return f"L{r.layer} · {kind}" if r.layer is not None else kind

    rows = [{"matrix": name(r), "‖P‖": round(r.patch_norm, 4),
             "‖P‖/‖W‖": f"{r.patch_norm / max(r.weight_norm, 1e-12):.2%}",
             "β used": float(f"{r.beta:.4g}"), "μ": float(f"{r.mu:.4g}"),
             "forget keys": r.n_forget_keys, "retain keys": r.n_retain_keys,
             "solve s": round(r.solve_seconds, 2)} for r in edit.layers]
    return pd.DataFrame(rows)


def edit_summary(edit) -> str:
    t = edit.timings
    band = ", ".join(map(str, edit.band)) if edit.band else "LM head"
    parts = " · ".join(f"{name} {t[name]:.2f} s" for name in ("scores", "keys", "solve", "apply") if name in t)
    return (f"**Edited** layers {band} of `{edit.matrix}` in **{t.get('total', 0):.1f} s** "
            f"({parts}). Total ‖P‖ = {edit.patch_norm():.4g}.")


def norms_figure(edit):
    return plots.plot_patch_norms([f"L{r.layer}" if r.layer is not None else "head" for r in edit.layers],
                                  [r.patch_norm for r in edit.layers],
                                  [r.patch_norm / max(r.weight_norm, 1e-12) for r in edit.layers])


ARROWS = {"down": "↓", "up": "↑", "zero": "→ 0", "half": "→ 0.5", "keep": "≈ base",
          "reference": "≈ retain model"}


RETAIN_SIDE = ("Retain", "Real authors", "World facts", "Utility", "Specificity", "Neighbour", "General")


def styled(frame: pd.DataFrame):
    """The metrics table with the Final score row and the Edited column emphasised."""
    def row_style(row):
        return ["font-weight: 700; background-color: rgba(112, 72, 232, 0.10)" if row["metric"] in HEADLINES[:2]
                else "" for _ in row]

    styler = frame.style.apply(row_style, axis=1)
    if "Edited" in frame.columns:
        styler = styler.set_properties(subset=["Edited"], **{"color": "#5f3dc4", "font-weight": "600"})
    return styler


HEADLINES = ("Final score", "Knowledge score", "Retain cost", "Retain broken")


def metrics_frame(report) -> pd.DataFrame:
    """Metrics as rows (the headline and the retain cost first), models as columns, with
    the goal's direction."""
    table = report.table().T
    first = [m for m in HEADLINES if m in table.index]
    order = first + [m for m in table.index if m not in first]
    table = table.loc[order]
    out = pd.DataFrame({"metric": table.index})
    for col in table.columns:
        out[col] = [format_metric(v) for v in table[col]]
    out["goal"] = [goal_arrow(m) for m in table.index]
    return out


def format_metric(value) -> str:
    """Three decimals; a tiny nonzero value (a KS p-value such as forget quality 5.8e-14)
    in scientific notation rather than a misleading 0.000; a missing one blank."""
    if value is None or pd.isna(value):
        return ""
    value = float(value)
    if value != 0 and abs(value) < 5e-4:
        return f"{value:.1e}"
    return f"{value:.3f}"


def goal_arrow(metric: str) -> str:
    """Which way a metric should go for a good unlearning edit: ↓, ↑, → 0, → 0.5, ≈ base,
    ≈ retain model, or '' (a count, such as the facts the unedited model knew)."""
    if metric in DIRECTION:
        return ARROWS[DIRECTION[metric]]
    if metric.endswith("facts known"):
        return ""
    return "↑" if metric.startswith(RETAIN_SIDE) else ""


def _prompt_answer(ex) -> tuple[str, str]:
    if hasattr(ex, "choices"):
        options = " / ".join(ex.choices)
        return f"{ex.question}  [{options}]", ex.answer
    if hasattr(ex, "prompt"):
        return ex.prompt, ex.answer
    if hasattr(ex, "question"):
        return ex.question, ex.answer
    body = ex.text
    return (body[:300] + "…") if len(body) > 300 else body, ""


def examples_html(examples, title: str, n: int = 6) -> str:
    """The first `n` examples as a readable table (wrapped text)."""
    rows = "".join(f"<tr><td>{html.escape(p)}</td><td>{html.escape(a)}</td></tr>"
                   for p, a in map(_prompt_answer, list(examples)[:n]))
    return (f'<div class="gen-table"><div class="gen-title">{html.escape(title)}</div><table><thead>'
            f"<tr><th>prompt or text</th><th>answer</th></tr></thead><tbody>{rows}</tbody></table></div>")


def title_html(title: str) -> str:
    """A title line over a table of answers (or alone, where there is no table)."""
    return f'<div class="gen-title">{html.escape(title)}</div>'


def answers_table_html(title: str, columns, rows, width: int | None = None) -> str:
    """A titled table of text cells (the attacks' questions and answers, the membership
    AUCs), each escaped and cut to `width` characters where given."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr class='gen-row'>" + "".join(f"<td>{html.escape(c if width is None else c[:width])}</td>"
                                                    for c in row) + "</tr>" for row in rows)
    return (f'<div class="gen-table">{title_html(title)}<table><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table></div>')


def describe(bench) -> str:
    sets = ", ".join(f"{k} {len(v)}" for k, v in bench.eval_sets.items())
    return (f"**{bench.name} / {bench.split}**: {bench.description} {len(bench.forget)} forget "
            f"and {len(bench.retain)} retain examples; evaluation sets: {sets or 'none'}.")


# The columns each table shows before it has rows (an empty gr.Dataframe shows "1 2 3").
EMPTY = {
    "matrices": ("matrix", "‖P‖", "‖P‖/‖W‖", "β used", "μ", "forget keys", "retain keys", "solve s"),
    "metrics": ("metric", "Base", "Edited", "goal"),
    "baseline": ("metric", "Base", "GROM", "baseline", "goal"),
    "history": ("#", "time", "benchmark", "β", "w_r", "ρ", "band", "edit s"),
    "sweep": ("point", "p(answer), forget", "p(answer), retain", "edit s"),
    "landscape": ("β", "w_r", "ρ", "fitted gone", "held-out gone", "kept lost", "words kept", "front", "edit s",
                  "read s", "card check"),
    "influence": ("rank", "share of ‖P‖", "example"),
    "quantization": ("metric", "Base", "Base 4-bit", "Edited", "Edited 4-bit"),
    "attacks": ("attack", "Base", "GROM", "GROM forgot", "probes", "seconds"),
}
# The labels of the tables whose label may say that they show an earlier edit's results
# (`components.studio.staleness`), as they read otherwise.
TABLE_LABELS = {
    "metrics": "Metrics before and after the edit",
    "attacks": ("Fact recall under each attack; \"forgot\": of the facts the base model stated under it, those "
                "no longer stated in words (degenerate text counted apart as broke, as on the card); the "
                "membership row is an AUC (click a row for its answers)"),
}


def empty_table(kind: str) -> pd.DataFrame:
    """A table with its columns and no rows: what it shows before (or after clearing) its data."""
    return pd.DataFrame(columns=list(EMPTY[kind]))


def download_box(what: str) -> gr.File:
    """The files under a table: its rows as CSV and JSON (filled when it has rows)."""
    return gr.File(label=f"Download {what}: CSV and JSON", file_count="multiple", interactive=False,
                   height=60, elem_classes="download-box")
