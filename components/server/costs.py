"""What a job reads from the data, counted in tokens of the session's model, and refused
beyond the host's limits before any work (limits: components/server/limits.py).

One uploaded forget row of 9 MB (1.4 million words) loaded in a tenth of a second and then
held the model for minutes: GROM_MAX_EXAMPLES counts rows, and the keys cut a text into
512-token windows (`grom.data.encoding`) with no cap on how many. So the work is bounded by what it
costs:

- GROM_MAX_EXAMPLE_TOKENS: the tokens of one example, every text of it any job tokenises
  (a text; a question, its answer, their paraphrases and perturbed answers; the options
  of a multiple-choice question; a fact's prompts and answers).
- GROM_MAX_JOB_TOKENS: the tokens one job reads, summed over the sets it uses: of the
  forget and retain examples giving keys (or training a baseline), the texts that give
  them (`KEY_FIELDS`: a question and its answer, a text, ...); of the evaluation
  examples, every text.

`check_loaded` runs when a benchmark is loaded (every example, and the forget set, which
every edit and baseline reads whole); `check_job` runs again when a job starts, with the
tokenizer of the model the session has then (it may have changed since the load) and the
sets that job combines. Both raise a `UserError` that names the example (its set, number
and first words), its size, the limit and what to do.

Counting costs next to nothing, however large the text:

- bounds first, from lengths alone: no token of a tokenizer covers more characters than its
  longest vocabulary entry (`token_chars`), so a text of more characters than that times the
  limit cannot fit and is refused without being tokenised (the 9 MB row: at once); and no
  tokenizer makes more tokens of a text than it has UTF-8 bytes (byte-level BPE: one per
  byte at most; others: one per character at most), so a short text surely fits;
- only an example (or a job) between its bounds is tokenised, in batches, stopping as soon
  as the outcome is known; the exact counts are kept per (example, tokenizer) for as long
  as the example lives, so the second job of a benchmark counts nothing.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Mapping, Sequence

from components.server.errors import UserError, shorten
from components.server.limits import limit

FALLBACK_TOKEN_CHARS = 64  # characters one token may cover where no tokenizer is known
BATCH = 256  # texts tokenised per call
FIRST_WORDS = 40  # characters of an example a message repeats

_lock = threading.Lock()
_exact: dict[tuple, "weakref.WeakKeyDictionary"] = {}  # tokenizer key -> {example: tokens}
_token_chars: dict[tuple, int] = {}  # tokenizer key -> characters of its longest token


def _tok_key(tokenizer) -> tuple:
    return (type(tokenizer).__name__, str(getattr(tokenizer, "name_or_path", "")), len(tokenizer))


KEY_FIELDS = ("question", "answer", "text", "choices", "prompt", "subject")
"""The fields keys (and a baseline's training rows) are made of: an edit reads only these of
its forget and retain examples; an evaluation reads every text."""
EVAL, KEYS = "eval", "keys"


def texts_of(example, role: str = EVAL) -> list[str]:
    """The texts of `example` a job tokenises: for an evaluation (`EVAL`) every string field
    and tuple of strings (perturbed answers, options), its id excepted; for keys (`KEYS`)
    those of `KEY_FIELDS`."""
    if isinstance(example, str):
        return [example]
    out: list[str] = []
    fields = dataclasses.fields(example) if dataclasses.is_dataclass(example) else ()
    for f in fields:
        if f.name == "id" or (role == KEYS and f.name not in KEY_FIELDS):
            continue
        value = getattr(example, f.name)
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, (tuple, list)):
            out.extend(v for v in value if isinstance(v, str))
    return out


def first_words(example) -> str:
    text = " ".join(" ".join(texts_of(example)[:1]).split()[:12])
    return shorten(text, FIRST_WORDS)


def token_chars(tokenizer) -> int:
    """The most characters one token of `tokenizer` covers (its longest vocabulary entry,
    added tokens included; byte-level entries are one character per byte): a text of
    `c` characters is at least `c / token_chars` tokens."""
    if tokenizer is None:
        return FALLBACK_TOKEN_CHARS
    key = _tok_key(tokenizer)
    if key not in _token_chars:
        try:
            longest = max((len(t) for t in tokenizer.get_vocab()), default=FALLBACK_TOKEN_CHARS)
        except Exception:  # noqa: BLE001  (a tokenizer without a vocabulary to list)
            longest = FALLBACK_TOKEN_CHARS
        _token_chars[key] = max(1, longest)
    return _token_chars[key]


def _bounds(example, chars_per_token: int, role: str = EVAL) -> tuple[int, int]:
    """(fewest, most) tokens `example` can be, from its lengths alone."""
    texts = texts_of(example, role)
    chars = sum(len(t) for t in texts)
    most = sum((len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass"))) + 1 for t in texts)
    return -(-chars // chars_per_token), most


def _cache(tokenizer, role: str):
    with _lock:
        return _exact.setdefault((*_tok_key(tokenizer), role), weakref.WeakKeyDictionary())


def _cached(cache, example) -> int | None:
    try:
        return cache.get(example)
    except TypeError:  # an example that cannot be hashed (a list inside): counted each time
        return None


def exact_tokens(tokenizer, examples: Sequence, role: str = EVAL) -> list[int]:
    """The tokens of each example (its texts for `role`, no special tokens), tokenised in
    batches where not counted before."""
    cache = _cache(tokenizer, role)
    out = [_cached(cache, ex) for ex in examples]
    todo = [i for i, n in enumerate(out) if n is None]
    for start in range(0, len(todo), BATCH):
        chunk = todo[start:start + BATCH]
        texts, owner = [], []
        for i in chunk:
            for t in texts_of(examples[i], role):
                texts.append(t)
                owner.append(i)
        for i in chunk:
            out[i] = 0
        if texts:
            ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            for i, row in zip(owner, ids):
                out[i] += len(row)
        with _lock:
            for i in chunk:
                try:
                    cache[examples[i]] = out[i]
                except TypeError:
                    pass
    return out


SET_NAMES = {"forget": "Forget", "retain": "Retain"}


def _example_error(set_name: str, index: int, example, size: str) -> UserError:
    where = f"{SET_NAMES.get(set_name, set_name.replace('_', ' ').capitalize())} example {index + 1:,}"
    return UserError(
        f"{where} (\"{first_words(example)}\") is {size}, more than this server takes in one example "
        f"(at most {limit('GROM_MAX_EXAMPLE_TOKENS'):,} tokens, GROM_MAX_EXAMPLE_TOKENS). Cut it into "
        "shorter rows (a long text into passages of a few hundred words), or, hosting the studio "
        "yourself, raise GROM_MAX_EXAMPLE_TOKENS.")


def check_examples_fit(tokenizer, sets: Mapping[str, Sequence]) -> None:
    """Every example of `sets` within GROM_MAX_EXAMPLE_TOKENS: one longer than the limit
    could be in characters is refused untokenised; only one its bytes do not settle is
    tokenised."""
    cap, per = limit("GROM_MAX_EXAMPLE_TOKENS"), token_chars(tokenizer)
    for name, examples in sets.items():
        unsure = []
        for i, ex in enumerate(examples):
            lo, hi = _bounds(ex, per)
            if lo > cap:
                chars = sum(len(t) for t in texts_of(ex))
                raise _example_error(name, i, ex, f"{chars:,} characters long (at least {lo:,} tokens: a "
                                     f"token of this model covers at most {per} characters)")
            if hi > cap:
                unsure.append(i)
        if unsure and tokenizer is not None:
            counts = exact_tokens(tokenizer, [examples[i] for i in unsure])
            for i, n in zip(unsure, counts):
                if n > cap:
                    raise _example_error(name, i, examples[i], f"{n:,} tokens long")


def role_of(name: str) -> str:
    """How a job reads the set `name`: the forget and retain sets give keys (or training
    rows), any other is evaluated."""
    return KEYS if name in ("forget", "retain") else EVAL


def check_job(tokenizer, what: str, sets: Mapping[str, Sequence], advice: str = "") -> int | None:
    """The tokens the job `what` ("This edit") reads from `sets` (name -> examples; "forget"
    and "retain" read for keys, any other evaluated: `role_of`), each example checked first
    (`check_examples_fit`); beyond GROM_MAX_JOB_TOKENS a `UserError` that says how much, of
    which sets, and `advice` (what to ask for less of). Returns the exact count where it was
    needed, else None (the bounds settled it)."""
    check_examples_fit(tokenizer, sets)
    cap, per = limit("GROM_MAX_JOB_TOKENS"), token_chars(tokenizer)
    flat = [(name, ex) for name, examples in sets.items() for ex in examples]
    bounds = [_bounds(ex, per, role_of(name)) for name, ex in flat]
    low, high = sum(lo for lo, _ in bounds), sum(hi for _, hi in bounds)
    if high <= cap:
        return None
    if low > cap:
        raise _job_error(what, sets, f"at least {low:,}", advice, cap)
    if tokenizer is None:
        return None
    known, rest_low, rest_high = 0, low, high
    counted: dict[str, int] = {}
    for start in range(0, len(flat), BATCH):
        chunk = flat[start:start + BATCH]
        counts = [exact_tokens(tokenizer, [ex], role_of(name))[0] for name, ex in chunk] \
            if len({role_of(name) for name, _ in chunk}) > 1 else \
            exact_tokens(tokenizer, [ex for _, ex in chunk], role_of(chunk[0][0]))
        for (name, _), n, (lo, hi) in zip(chunk, counts, bounds[start:start + BATCH]):
            known, rest_low, rest_high = known + n, rest_low - lo, rest_high - hi
            counted[name] = counted.get(name, 0) + n
        if known + rest_low > cap:
            done = start + len(chunk) >= len(flat)
            raise _job_error(what, sets, f"{known:,}" if done else f"at least {known + rest_low:,}",
                             advice, cap, counted if done else None)
        if known + rest_high <= cap:
            return None if start + len(chunk) < len(flat) else known
    return known


def _job_error(what: str, sets: Mapping[str, Sequence], amount: str, advice: str, cap: int,
               counted: dict | None = None) -> UserError:
    parts = ", ".join(f"{name.replace('_', ' ')} {len(v):,} examples"
                      + (f" ({counted[name]:,} tokens)" if counted and name in counted else "")
                      for name, v in sets.items() if len(v))
    return UserError(f"{what} would read {amount} tokens of data ({parts}), more than this server lets one "
                     f"job read (at most {cap:,} tokens, GROM_MAX_JOB_TOKENS). "
                     f"{advice or 'Use fewer or shorter examples.'} Hosting the studio yourself, raise "
                     "GROM_MAX_JOB_TOKENS.")


def check_loaded(bench, tokenizer) -> None:
    """A benchmark just loaded: every example of its forget, retain and evaluation sets
    within GROM_MAX_EXAMPLE_TOKENS, and its forget set (every edit, layer score and
    baseline reads it whole) within GROM_MAX_JOB_TOKENS."""
    sets = {"forget": bench.forget, "retain": bench.retain}
    sets |= {name: v for name, v in (bench.eval_sets or {}).items() if v is not bench.forget and v is not bench.retain}
    check_examples_fit(tokenizer, sets)
    check_job(tokenizer, f"Every edit of {bench.name}/{bench.split}", {"forget": bench.forget},
              "Upload fewer or shorter forget examples, or choose a smaller split.")


EDIT_ADVICE = ("Use fewer retain examples (Advanced settings: retain examples) or a smaller forget set "
               "(a smaller split, or fewer forget rows).")
EVAL_ADVICE = "Evaluate fewer examples per set, or choose a smaller split."


def check_edit_data(tokenizer, forget, retain, what: str = "This edit") -> None:
    """An edit's (or the layer scores') data: the forget set and the retain examples giving keys."""
    check_job(tokenizer, what, {"forget": forget, "retain": retain}, EDIT_ADVICE)


def evaluation_sets(bench, n) -> dict[str, tuple]:
    """The examples a comparison of up to `n` examples per set (None: all) evaluates."""
    from grom.eval.report import eval_sets

    return {f"evaluation {name}": v for name, v in eval_sets(bench, n).items()}


def check_comparison(tokenizer, bench, n, what: str = "This comparison") -> None:
    check_job(tokenizer, what, evaluation_sets(bench, n), EVAL_ADVICE)
