"""The paper's other trained comparators, as rows of the method registry (registered at
import, after the built-in four): IDK-NLL, IDK-DPO, UNDIAL, WGA, SatImp, CE-U, PDU, RMU,
TaskVector, AltPO and RKLD.

Losses and defaults from github.com/locuslab/open-unlearning at commit
d3d7cf9e6b3c125d16687d4232680d8d83548f1a (``src/trainer/unlearn/<method>.py``,
``configs/trainer/<Method>.yaml`` ``method_args``), where it has the method:

- IDK-DPO: dpo.py, DPO.yaml (beta 0.1, gamma 1, alpha 1), run by
  configs/experiment/unlearn/tofu/idk.yaml on ``QAwithIdkDataset``: DPO with the "I don't
  know" answer as the winner and the forget answer as the loser.
- IDK-NLL: OpenUnlearning has no trainer for it; it is TOFU's ``forget_loss == "idk"``
  (locuslab/tofu dataloader.py at 8c49eee7da2b96b2b718c41c66f4e21331c89189): fine-tune on
  the "I don't know" answers and the retain answers. Written here in OpenUnlearning's
  form ``gamma * NLL(idk) + alpha * retain``; TOFU takes one token mean over both batches
  together, which weights the two by their token counts instead of 1 : 1.
- UNDIAL: undial.py, UNDIAL.yaml (beta 10, gamma 1, alpha 0: no retain term by default).
  UNDIAL.yaml's own lr 1e-4 is overridden by the experiment's in upstream TOFU runs, so
  the benchmark's recipe applies here too.
- WGA: wga.py, WGA.yaml (beta 1, gamma 1, alpha 1). SatImp: satimp.py, SatImp.yaml
  (beta1 5, beta2 1, gamma 0.1, alpha 1). CE-U: ceu.py, CEU.yaml (ignore_first_n_answer_tokens
  1, no retain term).
- PDU: pdu.py, PDU.yaml (gamma 1, alpha 1, dual_step_size 1, dual_warmup_epochs 5,
  primal-dual on, the dual updated at every micro-batch). Upstream has no default for
  ``retain_loss_eps`` (the retain loss the constraint allows); here a negative value (the
  default, -1) takes the retain loss of the first retain batch under the unedited model.
- RMU: rmu.py, RMU.yaml (steering_coeff 2, gamma 1, alpha 1, the activations of
  ``model.layers.7``, retain term EMBED_DIFF: the retain activations held to the unedited
  model's), with the original recipe of centerforaisafety/wmdp rmu/unlearn.py (`RMU_RECIPE`:
  constant lr 5e-5, 80 steps, only layers 5-7's ``mlp.down_proj`` trained; RMU.yaml trains
  every parameter). The frozen copy is a copy of the trained matrices only, run through
  ``functional_call``. A caller changing `layer` should change `params` with it.
- TaskVector: MUSE's baselines/baselines/task_vector.py (jaechan-repo/muse_bench at
  e0000386e5318665693db28e27b41711674256ef): fine-tune on the forget set, then
  ``theta_0 - scale * (theta_ft - theta_0)`` (MUSE's ``alpha``, 1 by default). The
  fine-tuning is this trainer's run with the benchmark's recipe; the Edit is the negated,
  scaled change.
- AltPO: OpenUnlearning runs it as its DPO trainer (dpo.py, DPO.yaml: beta 0.1, gamma 1,
  alpha 1) on ``QAwithAlternateDataset`` with the model's own alternate answers as the
  winners (community/methods/AltPO: generate.py, generate.yaml, run.sh), which is the
  authors' ``dpo`` loss (molereddy/Alternate-Preference-Optimization dataloader.py at
  c9b78bd8bc10ae1d0bb6a117b19f92b3ebf5ff67: DPO(alternate, forget) + retain NLL). So its
  loss is IDK-DPO's with other winners. 5 alternates per question, sampled at temperature
  1 (grom.baselines.alternates, where the deliberate differences are), each a row of the
  forget set, and 2 epochs over those rows (run.sh's ``num_train_epochs=2``: 10 visits per
  question, as TOFU's 10 epochs), unless the caller gives epochs.
- RKLD: no OpenUnlearning trainer; the paper (Wang et al. 2024, arXiv 2406.01983) trains
  the reverse KL to a teacher formed from a model strengthened on the forget set, plus a
  retain term. Here the teacher needs no second run (`grom.baselines.token_losses.rkld_loss`
  says how): the unedited model with the answer token's logit lowered by beta, 10 as
  UNDIAL's, so that the two differ only in the divergence and its positions; gamma 1 and
  alpha 1 (a retain NLL term) as OpenUnlearning's other methods.
"""
from __future__ import annotations

import torch

from grom.baselines.alternates import generate_alternates
from grom.baselines.losses import dpo_loss, mean_nll
from grom.baselines.methods import LossInputs, Method, register_method, with_retain
from grom.baselines.token_losses import (ceu_loss, pdu_forget_loss, rkld_loss, rmu_activation_loss,
                                        satimp_loss, undial_loss, wga_loss)

Terms = tuple[torch.Tensor, dict[str, torch.Tensor]]


def idk_nll(x: LossInputs) -> Terms:
    return with_retain(mean_nll(x.alternate_nll, x.alternate_counts), x)


def idk_dpo(x: LossInputs) -> Terms:
    forget = dpo_loss(x.alternate_nll, x.reference_alternate_nll, x.forget_nll, x.reference_nll, x.args["beta"])
    return with_retain(forget, x)


def undial(x: LossInputs) -> Terms:
    return with_retain(undial_loss(x.forget_logits, x.reference_logits, x.forget_labels, x.args["beta"]), x)


def wga(x: LossInputs) -> Terms:
    return with_retain(wga_loss(x.forget_logits, x.forget_labels, x.args["beta"]), x)


def satimp(x: LossInputs) -> Terms:
    forget = satimp_loss(x.forget_logits, x.forget_labels, x.args["beta1"], x.args["beta2"])
    return with_retain(forget, x)


def ceu(x: LossInputs) -> Terms:
    forget = ceu_loss(x.forget_logits, x.forget_labels, int(x.args["ignore_first"]))
    return forget, {"forget": forget}


def pdu(x: LossInputs) -> Terms:
    """``gamma * forget + lambda * (retain - eps)``, the retain weight lambda a dual variable
    (starting at alpha) raised by ``dual_step_size * (retain - eps)`` after each micro-batch
    once `dual_warmup_epochs` passes are done (clipped at 0), as upstream's
    ``final_loss_value``; the loss uses lambda before the update."""
    a, st = x.args, x.state if x.state is not None else {}
    forget = pdu_forget_loss(x.forget_logits, x.forget_labels)
    retain = mean_nll(x.retain_nll, x.retain_counts) if x.retain_kl is None else x.retain_kl
    eps = a["retain_loss_eps"] if a["retain_loss_eps"] >= 0 else st.setdefault("eps", float(retain.detach()))
    shifted = retain - eps
    lam = st.setdefault("retain_preference", a["alpha"])
    loss = a["gamma"] * forget + lam * shifted
    if a["primal_dual"] and x.epoch >= a["dual_warmup_epochs"]:
        st["retain_preference"] = max(0.0, lam + a["dual_step_size"] * float(shifted.detach()))
    return loss, {"forget": forget, "retain": retain, "retain_preference": torch.tensor(lam)}


def rmu(x: LossInputs) -> Terms:
    """``gamma * |h_forget - c|^2 + alpha * |h_retain - h_retain_ref|^2`` at decoder layer
    `layer`; the control vector ``c = steering_coeff * u / |u|``, u uniform in [0, 1)^d,
    drawn once per run from the run's seeded generator (upstream: ``torch.rand``, once)."""
    st = x.state if x.state is not None else {}
    h = x.forget_hidden
    if "control" not in st:
        u = torch.rand(1, 1, h.shape[-1])
        st["control"] = u / u.norm() * x.args["steering_coeff"]
    forget = rmu_activation_loss(h, st["control"].expand_as(h), x.forget_labels)
    loss, terms = x.args["gamma"] * forget, {"forget": forget}
    if x.retain_hidden is not None:
        retain = rmu_activation_loss(x.retain_hidden, x.reference_retain_hidden, x.retain_labels)
        loss, terms["retain"] = loss + x.args["alpha"] * retain, retain
    return loss, terms


def rkld(x: LossInputs) -> Terms:
    """``gamma * RKL(forget answers) + alpha * retain`` (`rkld_loss`: the teacher is the
    unedited model's logits, from a copy of the trained weights, with the answer lowered)."""
    return with_retain(rkld_loss(x.forget_logits, x.reference_logits, x.forget_labels, x.args["beta"]), x)


def write_alternates(model, tokenizer, forget, s, progress) -> tuple[tuple[str, ...], ...]:
    """AltPO's alternates: `n_alternates` answers per question written by the model
    (grom.baselines.alternates.generate_alternates), seeded with the run's seed."""
    a = s.method_args
    return generate_alternates(model, tokenizer, forget, n=int(a["n_alternates"]), temperature=a["temperature"],
                               max_new_tokens=int(a["max_new_tokens"]), seed=s.seed,
                               prompt_format=s.prompt_format, progress=progress)


def check_altpo(args) -> None:
    """AltPO's generation settings: whole numbers of answers and new tokens, a temperature
    >= 0, and more than one answer per question only when sampling (temperature > 0)."""
    for k in ("n_alternates", "max_new_tokens"):
        if args[k] != int(args[k]):
            raise ValueError(f"AltPO: {k} = {args[k]}; it must be a whole number")
    if args["temperature"] < 0 or (args["temperature"] == 0 and args["n_alternates"] > 1):
        raise ValueError(f"AltPO: temperature = {args['temperature']}; use > 0 to sample "
                         f"{args['n_alternates']:g} answers per question (0, greedy, writes one)")


def finetune(x: LossInputs) -> Terms:
    """Plain fine-tuning on the forget answers (the task vector's training run)."""
    nll = mean_nll(x.forget_nll, x.forget_counts)
    return nll, {"finetune": nll}


def negate_scaled(patches: dict, args) -> dict:
    """The task vector's edit: ``-scale * (theta_ft - theta_0)`` per parameter, in float32,
    cast back to the weight's dtype."""
    return {n: (-args["scale"] * d.float()).to(d.dtype) for n, d in patches.items()}


_RETAIN = dict(gamma=1.0, alpha=1.0)
# centerforaisafety/wmdp rmu/unlearn.py (bc5e1ba0367ea826caeeeaa50656336a1e87acfb, cited by
# OpenUnlearning's rmu.py): lr 5e-5, no schedule, 80 batches, layers 5-7's MLP down_proj
# (param_ids [6]); OpenUnlearning's WMDP experiment runs the same lr, steps and schedule.
RMU_RECIPE = dict(lr=5e-5, schedule="constant", max_steps=80, warmup_epochs=0.0, weight_decay=0.0,
                  params=tuple(f".layers.{i}.mlp.down_proj" for i in (5, 6, 7)))
MORE = (
    Method("idknll", "IDK-NLL", idk_nll, "Trains the model to answer each forget question with \"I don't "
           "know\" (a seeded refusal per question) while training on the retain answers; needs "
           "question/answer forget examples and a retain set.", needs_retain=True, needs_answers=True,
           defaults=_RETAIN),
    Method("idkdpo", "IDK-DPO", idk_dpo, "Preference optimisation: prefers \"I don't know\" to the forget "
           "answer, relative to the unedited model, plus a retain term; needs question/answer forget "
           "examples, a retain set and one reference pass.", needs_retain=True, needs_reference=True,
           needs_answers=True, defaults={"beta": 0.1, **_RETAIN}, positive=("beta",)),
    Method("undial", "UNDIAL", undial, "Self-distillation: trains toward the unedited model's next-token "
           "distribution with the answer token's logit lowered by beta; needs the forget set only "
           "(a copy of the trained weights as the teacher).", needs_retain=True,
           needs_reference_logits=True, defaults={"beta": 10.0, "gamma": 1.0, "alpha": 0.0}),
    Method("wga", "WGA", wga, "Weighted gradient ascent: each forget token weighted by its own probability, "
           "so confident tokens are pushed first, plus a retain term; needs a retain set.",
           needs_retain=True, defaults={"beta": 1.0, **_RETAIN}),
    Method("satimp", "SatImp", satimp, "Gradient ascent weighted toward forget tokens of middling "
           "probability (saturation and importance weights), plus a retain term; needs a retain set.",
           needs_retain=True, defaults={"beta1": 5.0, "beta2": 1.0, "gamma": 0.1, "alpha": 1.0}),
    Method("ceu", "CE-U", ceu, "Cross-entropy unlearning: trains toward the model's own distribution with "
           "the answer token removed, a bounded loss; needs the forget set only.",
           defaults={"ignore_first": 1.0}),
    Method("pdu", "PDU", pdu, "Primal-dual unlearning: flattens the next-token distribution on the forget "
           "answers, with a retain weight that rises while the retain loss is above its bound; needs a "
           "retain set.", needs_retain=True,
           defaults={"gamma": 1.0, "alpha": 1.0, "retain_loss_eps": -1.0, "dual_step_size": 1.0,
                     "dual_warmup_epochs": 5.0, "primal_dual": 1.0}, positive=("alpha",)),
    Method("rmu", "RMU", rmu, "Representation misdirection: steers one layer's activations on the forget "
           "data toward a fixed random vector while holding the retain activations to the unedited "
           "model's; trains a few layers' MLP output matrices; needs a retain set.", needs_retain=True,
           needs_hidden=True, defaults={"layer": 7.0, "steering_coeff": 2.0, "gamma": 1.0, "alpha": 1.0},
           positive=("steering_coeff",), recipe=RMU_RECIPE),
    Method("taskvector", "TaskVector", finetune, "Task arithmetic: fine-tunes on the forget set, then "
           "subtracts the scaled weight change from the unedited model; needs the forget set only.",
           defaults={"scale": 1.0}, positive=("scale",), finish=negate_scaled),
    # AltPO's loss is IDK-DPO's (DPO, the alternate the winner), on the model's own alternates
    Method("altpo", "AltPO", idk_dpo, "Alternate preference optimisation: the model first writes a few "
           "plausible wrong answers to each forget question, then learns to prefer them to the true one, "
           "relative to the unedited model, plus a retain term; needs question/answer forget examples, a "
           "retain set, one generation pass and one reference pass.", needs_retain=True,
           needs_reference=True, needs_answers=True,
           defaults={"beta": 0.1, **_RETAIN, "n_alternates": 5.0, "temperature": 1.0, "max_new_tokens": 64.0},
           positive=("beta", "n_alternates", "max_new_tokens"), recipe={"epochs": 2.0},
           make_alternates=write_alternates, check=check_altpo),
    Method("rkld", "RKLD", rkld, "Reverse-KL distillation: trains each forget answer's next-token "
           "distribution toward the unedited model's with the answer token's logit lowered by beta, "
           "weighted by the model's own distribution, plus a retain term; needs a retain set (a copy "
           "of the trained weights as the teacher).", needs_retain=True, needs_reference_logits=True,
           defaults={"beta": 10.0, **_RETAIN}, positive=("beta",)),
)
for _row in MORE:
    register_method(_row)
