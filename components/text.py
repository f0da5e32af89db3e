"""The words of the page: one sentence per step for teaching, and the math (KaTeX)."""
import gradio as gr

LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]


def md(value: str = "", **kw) -> gr.Markdown:
    """A Markdown block that renders $inline$ and $$display$$ math."""
    return gr.Markdown(value, latex_delimiters=LATEX, **kw)


INTRO = """\
# GROM Studio
**Gradient-free Rapid One-shot Machine unlearning**: one closed-form least-squares edit per
matrix makes a language model stop producing a *forget* set while it keeps a *retain* set,
with no gradient steps. Follow the numbers, or press **Run edit** straight away.
"""

MODEL = ("**1 · Model.** GROM edits the weights of a causal language model: the bundled demo "
         "(a tiny Llama trained on fictitious authors, seconds on a CPU), a paper target, or type "
         "a Hub id or a folder in `models/`.")

BENCHMARK = ("**2 · Benchmark.** The *forget* set is what the model should no longer say, the "
             "*retain* set what it must keep saying; both give the keys of the edit.")

LAYERS = ("**3 · Layers.** The logit lens asks how much each layer writes the forget answers' "
          "tokens straight into the logits, beyond what it does for the retain answers; the "
          "contiguous band of width $k$ with the largest mean score is edited.")

LAYERS_MATH = r"""
$$S_l = F_l - R_l,\qquad F_l = \frac{\sum_j \alpha_j \langle w_{g_j}, o_l(j)\rangle}{\sum_j \alpha_j},\qquad R_l = \operatorname{mean}_j \langle w_{g_j}, o_l(j)\rangle$$

$o_l(j)$ is the output of layer $l$'s edited matrix at position $j$, $w_{g}$ the LM-head row
of the gold next token $g_j$, and $\alpha_j$ its specificity weight.
"""

EDIT = ("**4 · Edit.** The keys $X_f$ (forget) and $X_r$ (retain) are the inputs of the edited "
        "matrix $W$ at every position that predicts an answer token; one linear solve finds the "
        "patch $P$ that moves the forget outputs to the target $D$ and leaves the retain "
        "outputs alone.")

EDIT_MATH = r"""
$$P = \frac{w_f}{s}\, D X_f^\top A^{-1},\qquad A = \frac{w_r}{r} X_r X_r^\top + \frac{w_f}{s} X_f X_f^\top + \mu I,\qquad \mu = \rho\,\overline{\operatorname{diag}(A_{\text{data}})}$$

Suppression: $d_j = -\beta\,\alpha_j\,u_j$ with $u_j$ the unit LM-head row of the gold token and
$\alpha_j = \max\bigl(0, 1 - \mathrm{rf}(g_j)/\mathrm{ff}(g_j)\bigr)$; corruption: $d_j = c\,u$
for one fixed random unit vector $u$. Only $w_r / w_f$ matters ($w_f = 1$). Then
$W \leftarrow W + P$, layer by layer through the band.
"""

COMPARE = ("**5 · Compare.** The same questions go to the model before and after the edit (and "
           "to the model trained without the forget set, the gold standard): forget answers "
           "should break, retain answers should not move.")

BASELINE = ("The gradient baselines unlearn by fine-tuning: for several epochs they take gradient "
            "steps that push the likelihood of the forget answers down (GA alone; GradDiff, NPO and "
            "SimNPO with a term that keeps the retain answers likely), while GROM's time is one "
            "least-squares solve per edited layer.")

BASELINE_RECIPE = ("OpenUnlearning's TOFU recipe: AdamW, batch 8 × 4 accumulation steps (32), "
                   "linear warm-up over the first epoch then decay. The learning rate starts at a "
                   "default for the loaded model (the recipe's 1e-5 for Hub models; for the demo, "
                   "a rate from a sweep that forgets without wrecking the rest, BENCHMARKS.md). The metrics "
                   "use the examples set above; the shared model is left unchanged and the "
                   "GROM edit stays as it is.")

DIAGNOSTICS = ("**6 · Diagnostics.** Look inside the edit: where the edited matrix sends each "
               "example, which forget examples shaped the patch most, how β trades forgetting "
               "against keeping, and whether the edit survives 4-bit quantization.")

PCA = ("Each point is one example's mean output of the edited matrix over its answer positions, "
       "before ($Wx$, hollow) and after ($(W+P)x$, filled), projected on three principal "
       "components: forget examples should move, retain examples should stay.")

INFLUENCE = r"""Theorem 2: removing forget example $i$ (key block $C_i$) changes the patch by a
rank-$c_i$ term, $\Delta P_i = P - P_{-i} = L_i R_i^\top$, found from the cached factor of $A$ with
one $c_i \times c_i$ solve (Woodbury). Bars show $\lVert \Delta P_i\rVert_F / \lVert P\rVert_F$;
pick a rank to read the example."""

SWEEP = ("Each value is a full edit of the session's last edit with that one setting changed "
         "(its band, data and seed kept; the forward pass up to the band is reused). A point is "
         "scored by the mean probability of the gold answer, teacher-forced, on up to 40 forget and "
         "40 retain evaluation examples: a quick proxy, not the Compare tab's metrics.")

HISTORY = ("Every edit of this session (the last 50), with its settings and, once "
           "compared, its headline metrics; the scatter puts forgetting against keeping for each "
           "compared run. Click a row to put its settings back into the Edit panel.")

QUANT = ("A 4-bit copy of the edited model should still forget: an edit that lives below the "
         "quantization step would come back after quantizing.")

EXPORT = ("**7 · Export.** The edit is data: the patch $P$ per matrix in safetensors and the "
          "settings in JSON (the model by its name, the benchmark, split, retain sample and seed, "
          "every setting and the band); apply it to the same base model with the library, or load "
          "it back here.")

IMPORT = ("**Load a run.** Upload an exported `edit.json`: the benchmark and every setting come back "
          "(press Run edit to run it again). Upload `patch.safetensors` with it and, if the model "
          "matches, the edit itself comes back too.")

SNIPPET = '''\
# pip install .   (in the GROM Studio repository: the package grom-studio, which provides grom)
from grom import Edit
from grom.models import load_model

model, tokenizer = load_model({model!r})
edit = Edit.load("{folder}")          # patch.safetensors + edit.json
with edit.applied(model):              # W <- W + P; restored bit for bit on exit
    ...                                # generate, evaluate
edit.apply(model)                      # or keep it applied
'''

DEMO_SNIPPET_LOAD = "from grom.demo import load_demo_model\nmodel, tokenizer = load_demo_model(\"full\")"
