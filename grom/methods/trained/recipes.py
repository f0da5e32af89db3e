"""OpenUnlearning's training recipes, one per benchmark, and the chunking of a corpus.

A `Recipe` is the training setup OpenUnlearning runs its gradient baselines with on one
benchmark: the HF Trainer arguments of ``configs/trainer/finetune.yaml`` overridden by
``configs/experiment/unlearn/<benchmark>/default.yaml``, and the data handler's sequence
length. Transcribed from github.com/locuslab/open-unlearning at commit
d3d7cf9e6b3c125d16687d4232680d8d83548f1a (2025-12-24):

- tofu: batch 8 x 4 accumulation (finetune.yaml), lr 1e-5, 10 epochs, weight decay 0.01,
  one epoch of warm-up (``warmup_epochs``, turned into steps by src/trainer/__init__.py
  ``load_trainer_args``), HF's default "linear" schedule; QA items of at most 512 tokens
  (configs/data/datasets/TOFU_QA_forget.yaml).
- muse: batch 4 x 8, lr 1e-5, 10 epochs, ``lr_scheduler_type: constant``, weight decay 0
  (finetune.yaml's, not overridden), no warm-up; the forget and retain corpora are each
  joined and cut into 2048-token chunks (MUSE_forget.yaml / MUSE_retain.yaml,
  ``PretrainingDataset`` in src/data/pretraining.py).
- wmdp: batch 1 x 16, lr 5e-5, ``max_steps: 80``, constant schedule, weight decay 0, no
  warm-up; corpora in 512-token chunks (WMDP_forget.yaml). Upstream pairs this recipe with
  RMU; here it trains whichever method is chosen.

Every recipe clips gradients to norm 1.0 (HF's ``max_grad_norm`` default). All run AdamW
(upstream ``optim: paged_adamw_32bit``: float32 moments) on the weights in the model's own
dtype (``bf16: True`` on a bfloat16 model: no float32 master copy); see grom.methods.trained.optimizer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from grom.data.schema import TextExample
from grom.eval.tasks import TASKS

UPSTREAM = "locuslab/open-unlearning@d3d7cf9e6b3c125d16687d4232680d8d83548f1a"
SCHEDULES = ("linear", "constant")


@dataclass(frozen=True)
class Recipe:
    """One benchmark's training setup.

    epochs / max_steps: the run's length (max_steps, when set, wins, as in HF). lr,
    weight_decay, max_grad_norm: AdamW's. batch_size x grad_accum: sequences per optimizer
    step. schedule: "linear" (warm-up then linear decay to 0) or "constant" (lr throughout).
    warmup_epochs: epochs' worth of warm-up steps (linear only). max_length: tokens per
    training sequence. chunk_corpus: join the text examples of each set and cut them into
    max_length-token chunks (`chunk_texts`) instead of windowing each document. source:
    the upstream file the values come from.
    """

    name: str
    epochs: float
    lr: float
    batch_size: int
    grad_accum: int
    schedule: str
    warmup_epochs: float
    weight_decay: float
    max_length: int
    source: str
    max_steps: int | None = None
    max_grad_norm: float = 1.0
    chunk_corpus: bool = False

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"recipe {self.name}: schedule {self.schedule!r}; use one of {SCHEDULES}")


RECIPES: dict[str, Recipe] = {
    "tofu": Recipe("tofu", epochs=10, lr=1e-5, batch_size=8, grad_accum=4, schedule="linear",
                   warmup_epochs=1.0, weight_decay=0.01, max_length=512,
                   source="configs/experiment/unlearn/tofu/default.yaml"),
    "muse": Recipe("muse", epochs=10, lr=1e-5, batch_size=4, grad_accum=8, schedule="constant",
                   warmup_epochs=0.0, weight_decay=0.0, max_length=2048, chunk_corpus=True,
                   source="configs/experiment/unlearn/muse/default.yaml"),
    "wmdp": Recipe("wmdp", epochs=1, lr=5e-5, batch_size=1, grad_accum=16, schedule="constant",
                   warmup_epochs=0.0, weight_decay=0.0, max_length=512, max_steps=80, chunk_corpus=True,
                   source="configs/experiment/unlearn/wmdp/default.yaml"),
}
DEFAULT_RECIPE = "tofu"


def get_recipe(name: str) -> Recipe:
    """The recipe `name` (case ignored)."""
    recipe = RECIPES.get(str(name).strip().lower())
    if recipe is None:
        raise ValueError(f"unknown training recipe {name!r}; use one of {', '.join(RECIPES)}")
    return recipe


def recipe_for_task(task: str) -> Recipe:
    """The recipe OpenUnlearning runs for a benchmark of this task (grom.data.schema
    Benchmark.task), as the task names it (`grom.tasks.Task.recipe`: MUSE's and WMDP's for
    theirs, TOFU's for question/answer ones); TOFU's for a task not registered."""
    found = TASKS.get(str(task).lower())
    return RECIPES[found.recipe if found is not None else DEFAULT_RECIPE]


def chunk_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[str]:
    """The texts joined by a blank line and cut into pieces of `max_length` tokens, each
    decoded back to text, as OpenUnlearning's ``PretrainingDataset._chunk_raw_text``.

    The joined text is tokenized without special tokens; piece k holds tokens
    ``[k * max_length, (k + 1) * max_length)``. Upstream makes ``len // max_length + 1``
    pieces, so a corpus of an exact multiple of max_length tokens ends with an empty piece;
    it carries no label, and is dropped here (the one difference: a step count one piece
    shorter in that case).
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, not {max_length}")
    ids = list(tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"])
    return [tokenizer.decode(ids[k:k + max_length]) for k in range(0, len(ids), max_length)]


def chunk_corpus(tokenizer, examples: Sequence, max_length: int) -> tuple:
    """`examples` with their text examples replaced by the chunks of their joined text
    (`chunk_texts`), after the other examples, which are kept as they are."""
    texts = [ex.text for ex in examples if isinstance(ex, TextExample)]
    rest = tuple(ex for ex in examples if not isinstance(ex, TextExample))
    if not texts:
        return rest
    return rest + tuple(TextExample(c, id=f"chunk-{k}")
                        for k, c in enumerate(chunk_texts(tokenizer, texts, max_length)))
