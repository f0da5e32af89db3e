"""AltPO, alternate preference optimisation, registered as a trained method: IDK-DPO's loss
with the model's own alternate answers as the winners.

OpenUnlearning runs it as its DPO trainer (dpo.py, DPO.yaml: beta 0.1, gamma 1, alpha 1) on
``QAwithAlternateDataset`` with the model's own alternate answers as the winners
(community/methods/AltPO: generate.py, generate.yaml, run.sh), which is the authors' ``dpo``
loss (molereddy/Alternate-Preference-Optimization dataloader.py at
c9b78bd8bc10ae1d0bb6a117b19f92b3ebf5ff67: DPO(alternate, forget) + retain NLL). 5 alternates
per question, sampled at temperature 1 (grom.methods.trained.alternates, where the
deliberate differences are), each a row of the forget set, and 2 epochs over those rows
(run.sh's ``num_train_epochs=2``: 10 visits per question, as TOFU's 10 epochs), unless the
caller gives epochs.
"""
from __future__ import annotations

from grom.methods.trained.alternates import generate_alternates
from grom.methods.trained.idk_dpo import idk_dpo
from grom.methods.trained.method import Method
from grom.methods.trained.register import register_method


def write_alternates(model, tokenizer, forget, s, progress) -> tuple[tuple[str, ...], ...]:
    """AltPO's alternates: `n_alternates` answers per question written by the model
    (grom.methods.trained.alternates.generate_alternates), seeded with the run's seed."""
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


ALTPO = register_method(Method(
    "altpo", "AltPO", idk_dpo, "Alternate preference optimisation: the model first writes a few "
    "plausible wrong answers to each forget question, then learns to prefer them to the true one, "
    "relative to the unedited model, plus a retain term; needs question/answer forget examples, a "
    "retain set, one generation pass and one reference pass.", needs_retain=True,
    needs_reference=True, needs_answers=True,
    defaults={"beta": 0.1, "gamma": 1.0, "alpha": 1.0, "n_alternates": 5.0, "temperature": 1.0,
              "max_new_tokens": 64.0},
    positive=("beta", "n_alternates", "max_new_tokens"), recipe={"epochs": 2.0},
    make_alternates=write_alternates, check=check_altpo), order=230)
