"""The words of the page: one sentence per step for teaching, and the math (KaTeX)."""
import gradio as gr

from grom.eval.metric_sources import IMPLEMENTATIONS, metric_source
from grom.methods.lunar import SOURCE as LUNAR_SOURCE

LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]


def md(value: str = "", **kw) -> gr.Markdown:
    """A Markdown block that renders $inline$ and $$display$$ math."""
    return gr.Markdown(value, latex_delimiters=LATEX, **kw)


INTRO = """\
# GROM Studio
Make a language model **forget** chosen facts and **keep** the rest, in one closed-form weight edit.
"""

HERO_STEPS = """\
Pick what to forget (the *forget set*) and what to keep (the *retain set*). ① The **Layers** tab finds
the layers that write the forget answers; ② **Run edit** solves once for a small weight change that
steers those answers away and leaves the retain answers alone; ③ **Compare** asks both models the
same questions, side by side. No gradient steps; the original weights come back exactly with
**Reset**.
"""

HERO_MATH = r"""
$$P=\frac{w_f}{s}\,D X_f^{\top} A^{-1},\quad A=\frac{w_r}{r}X_rX_r^{\top}+\frac{w_f}{s}X_fX_f^{\top}+\mu I$$
<div class="hero-caption">one ridge least-squares solve per edited matrix · no gradients · exact revert</div>
"""

BENCHMARK = ("**Benchmark.** The *forget* set is what the model should no longer say, the "
             "*retain* set what it must keep saying; both give the keys of the edit.")

NAME_ONLY = ("**Name only** (RWKU's setting, Jin et al. 2024): the method is given only the subject's name and "
             "a sentence saying what it is. The loaded model writes passages and questions about it (and "
             "answers its own questions), and the same about a few neighbouring subjects, which the edit keeps. "
             "Read what it wrote, fix or delete rows, choose what to fit on, then **Load what was written**. The edit "
             "is fitted only on the table; the comparison scores it on the subject's bundled questions, which "
             "the model did not write: both halves are held out here.")

NAME_ONLY_TIME = ("On a GPU the writing takes seconds; on a CPU minutes (SmolLM2 on 2 busy cores: 2 passages, 6 "
                  "questions and one neighbour took 5.4 min). What SmolLM2 writes about a subject states a third to a "
                  "half of the facts it knows, so the edit reaches fewer of them than the benchmark's own questions "
                  "do (BENCHMARKS.md, \"LUNAR beside GROM, and RWKU's name-only setting\").")

LAYERS = ("**Layers.** The logit lens asks how much each layer writes the forget answers' "
          "tokens straight into the logits, beyond what it does for the retain answers: where "
          "pushing the forget answers down is most direct. The contiguous band of width $k$ with "
          "the largest mean score is edited.")

LAYERS_SIGN = ("**Reading the bars.** $S_l$ measures how much layer $l$'s edited matrix writes the "
               "forget answers' tokens into the logits, beyond the retain answers': where suppression "
               "is most direct. A negative $S_l$ means the layer writes the *retain* answers' tokens "
               "more; it does not measure what an edit there costs of what you keep (**Compare** "
               "measures that). On SmolLM2's default edit (BENCHMARKS.md, bands by $S_l$), at the same "
               "β, three bands of negative $S_l$ kept 90–97% of the other known facts (the suggested "
               "band: 93%) but left 41–52% of the forget facts recalled (the suggested band: 7%); made "
               "to forget as much (layers 20–24 at 4× β), one kept only 71%. Bands of near-zero $S_l$ "
               "kept 78–90%. So a negative bar marks a layer where forgetting is indirect and costly, "
               "not one that by itself breaks what you keep. A preset fixes the band its β and $w_r$ "
               "were tuned with (for the paper's presets, the layers the paper reports for its model), "
               "so that its result is reproduced exactly; on other data choose **suggested** to "
               "follow the bars.")

LAYERS_MATH = r"""
$$S_l = F_l - R_l,\qquad F_l = \frac{\sum_j \alpha_j \langle w_{g_j}, o_l(j)\rangle}{\sum_j \alpha_j},\qquad R_l = \operatorname{mean}_j \langle w_{g_j}, o_l(j)\rangle$$

$o_l(j)$ is the output of layer $l$'s edited matrix at position $j$, $w_{g}$ the LM-head row
of the gold next token $g_j$, and $\alpha_j$ its specificity weight.
"""  # noqa: E501  a display formula is one line of LaTeX

EDIT_SHORT = ("**Edit.** One linear solve per edited matrix: the forget answers move away, the retain "
              "answers stay.")

EDIT = ("The keys $X_f$ (forget) and $X_r$ (retain) are the inputs of the edited "
        "matrix $W$ at every position that predicts an answer token; one linear solve finds the "
        "patch $P$ that moves the forget outputs to the target $D$ and leaves the retain "
        "outputs alone.")

EDIT_MATH = r"""
$$P = \frac{w_f}{s}\, D X_f^\top A^{-1},\qquad A = \frac{w_r}{r} X_r X_r^\top + \frac{w_f}{s} X_f X_f^\top + \mu I,\qquad \mu = \rho\,\overline{\operatorname{diag}(A_{\text{data}})}$$

Suppression: $d_j = -\beta\,\alpha_j\,u_j$ with $u_j$ the unit LM-head row of the gold token and
$\alpha_j = \max\bigl(0, 1 - \mathrm{rf}(g_j)/\mathrm{ff}(g_j)\bigr)$; corruption: $d_j = c\,u$
for one fixed random unit vector $u$; refusal: keys after each forget question followed by a refusal
("I don't know."), $d_j = \beta\,v_j$ with $v_j$ the unit $w_{g_j} - \bar w$ toward the refusal's next token.
Only $w_r / w_f$ matters ($w_f = 1$). Then
$W \leftarrow W + P$, layer by layer through the band.
"""  # noqa: E501  a display formula is one line of LaTeX

PATCH_RATIO = ("**‖P‖/‖W‖** is the size of the patch against the size of the matrix (Frobenius norms, "
               "summed over every input direction). Tens of percent sound large, but P is solved to act "
               "only where the forget keys lie: an input feels just the part of P along its own "
               "direction. How far each set's outputs actually moved is in **Diagnostics**.")

COMPARE = ("**Compare.** The same questions go to the model before and after the edit (and, "
           "for the demo, to its twin trained without the forget set, the gold standard): forget "
           "answers should stop stating their facts, in words (another answer or a refusal; broken "
           "text is not forgetting), retain answers should not move.")

BASELINE = ("The trained baselines unlearn by fine-tuning: for several epochs they take gradient "
            "steps that push the likelihood of the forget answers down (GA alone; GradDiff, NPO and "
            "SimNPO with a term that keeps the retain answers likely; IDK-NLL and IDK-DPO toward "
            "\"I don't know\"; UNDIAL, WGA, SatImp, CE-U, PDU, RMU, TaskVector as OpenUnlearning and "
            "MUSE define them), while GROM's time is one least-squares solve per edited layer. The "
            "closed-form editors (ROME, MEMIT, AlphaEdit, ZeroUnlearn) use GROM's own keys, retain "
            "covariance and band, with one per-fact value optimisation (the two boxes are then its "
            "steps and learning rate): only the update rule differs from GROM's. They need facts "
            "with a subject (real knowledge, ZsRE, the demo, TOFU (its authors, read from each one's 20 "
            "questions), or a `subject` column in your file); "
            "on a split without them they are greyed out (⊘) and the line under the box says why. "
            "LUNAR refits one layer's down_proj so the forget questions' activations move along a "
            "refusal direction (the glossary below says how); its two boxes are its epochs and "
            "learning rate.")

BASELINE_RECIPE = ("OpenUnlearning's recipe for the benchmark: AdamW on the weights in the model's "
                   "own dtype; TOFU-style and fact benchmarks: batch 8 × 4 accumulation steps (32), "
                   "linear warm-up over the first epoch then decay; MUSE: batch 4 × 8, a constant "
                   "rate, 2048-token chunks of the corpus; WMDP: batch 1 × 16, a constant rate. The "
                   "learning rate and epochs start at a default for the loaded model (the recipe's "
                   "1e-5 and 10 epochs for Hub models; for the demo and SmolLM2, values from a "
                   "search that forgets without wrecking the rest, BENCHMARKS.md). The metrics "
                   "use the examples set above; the shared model is left unchanged and the "
                   "GROM edit stays as it is.")

DIAGNOSTICS = ("**Diagnostics.** Look inside the edit: where the edited matrix sends each "
               "example, which forget examples shaped the patch most, and whether the edit survives "
               "4-bit quantization. (How one setting, β or another, trades forgetting against "
               "keeping is the **sweep**, under Edit details.)")

PCA = ("Each point is one example's mean output of the edited matrix over its answer positions, "
       "before ($Wx$, hollow) and after ($(W+P)x$, filled), joined by a line. The axes are the two "
       "directions along which the outputs moved most (the principal directions of the moves $Px$, "
       "not of the outputs, whose own spread would hide the moves): forget examples should travel, "
       "retain examples stay put.")

INFLUENCE = ("**What a bar says.** Each bar is one forget example, labelled with its question (hover "
             "for all of it). Its height answers: *if this one example were left out of the forget set, "
             "how much would the patch $P$ change?*, as a share of the size of $P$. The tallest bars are "
             "the examples that shaped the edit most; the shortest, those it hardly depends on. Pick a "
             "rank, or click a row of the table, to read an example.  \n"
             "**Why the bars add up to more than 100%.** Each bar is one example left out *alone*. The "
             "examples' changes point in different directions (each pushes down its own answer's "
             "tokens), and sizes in different directions do not add up: 3 steps east and 4 north leave "
             "you 5 steps from the start, not 7. So the bars are not slices of one whole, and leaving "
             "out two examples together changes $P$ by less than their two bars added (on SmolLM2's "
             "default edit the two tallest, about 26% and 25%, change it by 39% together; BENCHMARKS.md).")

SWEEP = ("Each value is a full edit of the session's last edit with that one setting changed "
         "(its band, data and seed kept; the forward pass up to the band is reused). A point is "
         "scored by the mean probability of the gold answer, teacher-forced, on up to 40 forget and "
         "40 retain evaluation examples: a quick proxy, not the Compare tab's metrics.")

LANDSCAPE = ("**The whole trade-off around your edit.** Each square is GROM's edit at one β and w_r (5 x 5 "
             "around yours, at the ρ chosen), exactly as Run edit makes it, and what it does to the facts the "
             "unedited model stated: the forget questions it was fitted on, held-out questions on the same "
             "subject, and kept facts. Each is read in one pass over the unedited answers rather than decoded, "
             "so a square costs seconds, not a card; how often that reading and the card disagree is counted "
             "below on every card you run at a square. ★ marks the Pareto front: no other square forgets "
             "more for less. Click a square (or a row) to put its settings in the Edit form, then Run edit.")

HISTORY = ("Every edit of this session (the last 50), with its settings and, once "
           "compared, its headline metrics, and every baseline or editor run of Compare (its method "
           "under \"from\", its own settings and metrics); the scatter puts forgetting against "
           "keeping for each compared run, GROM's in violet, the others as orange diamonds. Click a "
           "GROM row to put its settings back into the Edit panel.")

QUANT = ("A 4-bit copy of the edited model should still forget, and still keep the retain set: an "
         "edit that lives below the quantization step would come back after quantizing (the paper "
         "reports that gradient unlearning does; GROM's edit should not). It reads the examples the Compare "
         "tab uses (its Examples per set, or all examples), so its full-precision columns are Compare's.")

ATTACKS = ("**Is it gone?** The edit was fitted on some of the subject's questions; these attacks ask "
           "others it never saw (the *held-out probes*), reworded (paraphrase, fill in the blank, the answer "
           "back to the subject, another prompt format, solved examples first, and the adversarial "
           "wrappers of RWKU: a forced opening, an affirmative suffix, role play), ask questions written to "
           "reach the same facts another way (*multi-hop*: through another entity, \"Which planet has the moon "
           "Titan?\"; *alias*: under another name, \"the Red Planet\"), and attack the weights: a "
           "few fine-tuning steps on fitted questions (relearning, at an lr calibrated so that the same steps "
           "leave the unedited model's answers intact), 4- and 8-bit rounding, and the logit "
           "lens (is the answer still readable inside the model?), and the depth score (each layer's states "
           "put into the unedited model: from which layers does it read the fact back?). Each cell is fact "
           "recall: the share of "
           "probes whose greedy answer states the fact; the base model's column is the unedited model under "
           "the same attack (relearned too), what there was to forget. "
           "A forgetting that holds only on the fitted wording is masking, not removal. The "
           "membership row is an AUC instead: can an attacker who reads likelihoods tell the forget answers "
           "from answers about other subjects? 0.5 means no; far below 0.5 means the forget answers became "
           "conspicuously unlikely, which gives away what was unlearned. **Stop** ends a run at its next "
           "step; the model is left unedited either way.")

EXPORT = ("**Export.** The edit is data: the settings in JSON (the model by its name, the benchmark, "
          "split, retain sample and seed, every setting, the band, and the sha256 of the patch) and the "
          "patch $P$ per matrix in safetensors, as two thin factors $U V$ where that is smaller ($P$ has "
          "rank at most the number of forget keys $s$); apply it to the same base model with the "
          "library, or load it back here.")

IMPORT = ("**Load a run.** Upload an exported `edit.json`: the benchmark and every setting come back, and "
          "the edit is computed again (seconds) and checked against the sha256 the file records. "
          "*Identical* means bit for bit, what the machine that exported it gives; another torch, BLAS "
          "library or device may change the last bits, and the note says so (with `patch.safetensors` "
          "uploaded too, by how much). The patch file is needed only for an edit of uploaded benchmark "
          "files, which this server does not keep.")

SNIPPET = '''\
# pip install .   (in the GROM Studio repository: the package grom-studio, which provides grom)
import torch
from grom import Edit
from grom.data.prompts import encode_prompt
from grom.model.loading import load_model

model, tokenizer = load_model({model!r})
edit = Edit.load("{folder}")          # patch.safetensors + edit.json
question = {question!r}
prompt = torch.tensor([encode_prompt(tokenizer, question, edit.prompt_format)])


def answer() -> str:
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40, do_sample=False)
    return tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True).strip()


print("before:", answer())
with edit.applied(model):              # W <- W + P; restored bit for bit on exit
    print("after: ", answer())
edit.apply(model)                      # or keep it applied
'''


def _from(*measures: str) -> str:
    """" [OpenUnlearning]": the implementations the named metrics follow, from the library's
    one table (`grom.eval.metric_sources.METRIC_SOURCES`: the shared measures and each task's)."""
    sources = [metric_source(m) for m in measures]
    names = {s.implementation for s in sources}
    here = "".join(f"; here, {s.deviation}" for s in sources if s.deviation)
    return " [" + ", ".join(n for n in IMPLEMENTATIONS if n in names) + here + "]"


GLOSSARY = f"""\
**Goals.** ↓ lower after the edit, ↑ stays high, → 0 / → 0.5 towards that value, ≈ base as the
unedited model, ≈ retain model as the model trained without the forget set (the gold standard).
In brackets, the implementation a number follows, so you know what it can be compared with.

*Forget side: should fall.*
- **ROUGE-L**: how much of the gold answer (its words, in order) the model's greedy answer contains.{_from("ROUGE-L")}
- **prob**: the gold answer's probability per token (the geometric mean, teacher-forced).{_from("prob")}
- **ES** (extraction strength): 1 − the share of the gold answer you must give the model before it completes the rest itself; the final end-of-text token does not count, and a wrong last word still leaves 1/n.{_from("ES")}
- **EM** (exact memorization): the share of the gold answer's tokens the model predicts itself, teacher-forced (end-of-text not counted).{_from("EM")}
- **fact recall**: the share of the facts the unedited model stated that this model still states (real-knowledge counts only facts it knew); **paraphrase recall**: the same question in other words.{_from("fact recall")}
- **truth ratio**: TR compares how likely wrong answers are with a paraphrase of the right one; the forget side shows mean min(TR, 1/TR), 1 when the model cannot tell them apart. Its goal is the retain model's value, not 1.{_from("truth ratio")}
- **para-Q** (TOFU): the same measures with each question asked in other words (OpenUnlearning's paraphrased-question evaluation). **truth ratio closeness** (real-knowledge): mean min(TR, 1/TR) against the bundled wrong answers, ↑ towards 1 (there is no retain model to compare with).{_from("Forget para-Q ROUGE-L", "Forget truth ratio closeness")}
- **Forget quality** (TOFU, ↑): the p-value of a test that the edited and the retain model's truth ratios come from one distribution: high means the forget set looks as if never learned.{_from("Forget quality")}
- **MIA AUC** (→ 0.5): can a membership test (Min-K%: the 40% least likely tokens) tell the forget set from unseen text? 0.5: no. The other attacks' AUCs, read the same way: **LOSS** (mean loss), **zlib** (loss over compressed length), **Min-K++** (Min-K with each token measured against the model's own next-token spread), **Reference** (the loss minus the retain model's). **Privacy leakage** (→ 0): the Min-K gap, relative to the retain model.{_from("MIA AUC", "Privacy leakage", "MIA AUC (Reference)")}
- **repetition**: the share of repeated word triples (a broken answer loops); **answer perplexity**: how odd the new answers read to the unedited model (low: a fluent non-answer; high: noise).{_from("repetition")}
- **accuracy** (WMDP, multiple choice; chance is 0.25){_from("accuracy")}, **Efficacy** / **Generalisation** (zsRE: the forgotten answer's tokens on its prompt / a paraphrase){_from("Efficacy")}, **VerbMem** / **KnowMem forget** (MUSE){_from("VerbMem forget")}.

*Retain side: should stay.* The same measures on what must be kept (Retain, Real authors, World facts,
Neighbour and General facts, KnowMem retain, Utility accuracy, Specificity); the retain truth ratio is
mean max(0, 1 − TR), high when the model still tells right from wrong. **Model utility** (TOFU): the
harmonic mean of the retain-side numbers{_from("Model utility")}. **Text perplexity**: fluency on neutral texts, ≈ base{_from("Text perplexity")}.

*Headlines.* **Retain cost**: the largest share a retain metric lost against the unedited model
(0: nothing lost); **Retain broken**: 1 when that is more than a tenth{_from("Retain cost")}. **Knowledge score**: the
harmonic mean of the share of known forget facts forgotten and the share of known other facts kept
(0 for the unedited model and for one that forgets by wrecking the rest){_from("Knowledge score")}. **Final score**: the paper's
TOFU (model utility averaged with the forget side's 1 − ROUGE, 1 − prob, 1 − ES), MUSE or WMDP
formula: read it beside the retain cost, since forgetting more can raise it while the retain set suffers{_from("Final score")}.

*Methods beside GROM.* **LUNAR** (Compare's method box): takes a "refusal" direction, the mean residual
activation after one layer at the prompt's last token over prompts a chat model refuses, minus the mean over the
forget questions; then refits that layer's MLP output matrix (down_proj) so that at every token of the forget
questions the MLP's output moves by 2 × that direction while the retain questions' outputs stay, by AdamW on the
mean squared error (20 epochs, lr 0.01, the rate × 0.9 each epoch). Like GROM it edits a down_proj from forward
passes alone; its objective is GROM's least squares with another target (`solver="closed-form"` solves it
exactly). Source: {LUNAR_SOURCE}. On SmolLM2 it forgot more of the held-out probe facts than GROM, at
2-3x GROM's retain cost (BENCHMARKS.md, "LUNAR beside GROM").

*Settings beside the benchmarks.* **Name only** (the benchmark "name-only"; RWKU, Jin et al. 2024,
jinzhuoran/RWKU): the method gets only the subject's name and one sentence saying what it is; the loaded model
writes the forget text itself (passages and its own answers to its own questions) and the retain text about a few
neighbouring subjects, and the edit is scored on the bundled questions, which it did not write. SmolLM2's writing
states about a third to a half of the facts it knows about a subject.

*Implementations.* {" ".join(f"**{name}**: {where}." for name, where in IMPLEMENTATIONS.items())}
"""  # noqa: E501  one Markdown list item a line, as the page shows it


INFLUENCE_MATH = r"""Theorem 2: leaving out forget example $i$ (its key block $C_i$, $c_i$ columns, and
target block $D_i$), with $w_f/s$ and $\mu$ held, changes the patch by a rank-$c_i$ term,

$$\Delta P_i = P - P_{-i} = L_i R_i^\top,\qquad R_i = A^{-1} C_i,\qquad
L_i = (D_i - P C_i)\Bigl(\tfrac{s}{w_f} I - C_i^\top A^{-1} C_i\Bigr)^{-1},$$

from the factor of $A$ already computed, with one $c_i \times c_i$ solve (Woodbury). A bar is
$\lVert \Delta P_i\rVert_F / \lVert P\rVert_F$. To first order $\Delta P_i \approx Q_i = \tfrac{w_f}{s} D_i C_i^\top A^{-1}$
(the rest comes from $C_i$ leaving $A$), and $\sum_i Q_i = P$ exactly. Since
$\lVert P\rVert = \lVert \sum_i Q_i\rVert \le \sum_i \lVert Q_i\rVert$, with equality only when every $Q_i$ points
the same way, the bars add up to more than 100%; were the $Q_i$ at right angles, their squares
would add up to 100%. On SmolLM2's default edit the $\Delta P_i$ are nearly at right angles (mean
$|\cos|$ 0.01), their sum is $0.87\,\lVert P\rVert$ long, and their squared shares add up to 0.74."""  # noqa: E501  inline LaTeX, kept whole on its line
