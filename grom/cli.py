"""Command line: ``python -m grom edit|scores|attack|evaluate|write ...``, the library without the app."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grom.closed_form.config import EditConfig
    from grom.edit import Edit

# What the parser shows and checks, written out here: their sources (grom.closed_form.config,
# grom.model.sharding) load torch, seconds before `--help` or a wrong option could answer.
# tests/test_cli.py checks each against its source.
PRESET_NAMES = ("demo", "demo-forget01", "demo-forget05", "muse-books", "muse-news", "smollm2", "smollm2-prompt",
                "tofu10", "tofu5", "wmdp-bio", "zsre")
TARGETS = ("suppression", "corruption", "refusal")
KEY_POSITIONS = ("answer", "subject", "last_prompt", "prompt")  # grom.data.encoding.KEY_POSITIONS (a test says)
DEVICE_MAP_HELP = ("auto, balanced or sequential (accelerate spreads the model over the GPUs, then the "
                   "CPU, then disk), or one device: cpu, cuda, cuda:N")
MAX_MEMORY_HELP = ('per device, comma separated: GPU index or cpu = size, e.g. "0=20GiB,1=20GiB,cpu=60GiB" '
                   "(units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")


def layer_indices(text: str) -> tuple[int, ...]:
    """'11-15' or '3,5,7' -> a tuple of layer indices."""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b) + 1) if b else [int(a)])
    return tuple(out)


def _budget(text: str) -> int | str:
    """'20000' -> 20000; 'none' -> "none" (every key counts)."""
    if text.strip().lower() == "none":
        return "none"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a key budget is a whole number or 'none', not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a key budget must be at least 1 (or 'none'), not {value}")
    return value


def _sharding_arg(name: str):
    """An argparse `type=` from the `grom.model.sharding` parser `name` (its message on a bad
    value), imported when a value is given rather than to build the parser (torch)."""
    def convert(text: str):
        from grom.model import sharding

        try:
            return getattr(sharding, name)(text)
        except sharding.ShardingError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return convert


def _json_arg(p: argparse.ArgumentParser, what: str) -> None:
    """`--json [FILE]`: `what` as JSON, for scripts."""
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help=f"{what} as JSON: without FILE on stdout instead of the summary; with FILE written there")


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="local model folder or Hub id")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--dtype", default="float32", help="float32, float16 or bfloat16")
    p.add_argument("--device-map", type=_sharding_arg("parse_device_map"), metavar="MAP",
                   help=f"shard the model with accelerate: {DEVICE_MAP_HELP} (then --device is ignored; "
                        "edited layers must not land on disk)")
    p.add_argument("--max-memory", type=_sharding_arg("parse_max_memory"), metavar="BUDGETS",
                   help=f"with --device-map, the memory each device may hold: {MAX_MEMORY_HELP}")


def _benchmark_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--benchmark", required=required,
                   help="benchmark name (demo, tofu, ...)" if required else
                   "benchmark name (demo, tofu, muse-news, ...) instead of files")
    p.add_argument("--split", help="benchmark split, e.g. forget10")
    p.add_argument("--source", help="local folder of the benchmark's files (else the Hub)")


def _model_and_sets(p: argparse.ArgumentParser) -> None:
    _model_args(p)
    _benchmark_args(p)
    p.add_argument("--forget", help="forget file (JSON, JSONL or CSV of question/answer or text)")
    p.add_argument("--retain", help="retain file (same formats)")


def _data_args(p: argparse.ArgumentParser) -> None:
    _model_and_sets(p)
    p.add_argument("--preset", choices=PRESET_NAMES, help="start from the paper's settings")
    p.add_argument("--matrix", choices=["down_proj", "o_proj", "lm_head"])
    p.add_argument("--layers", type=layer_indices, help="layers to edit, e.g. 11-15 (default: automatic band)")
    p.add_argument("-k", type=int, help="width of the automatic band")
    p.add_argument("--target", choices=TARGETS)
    p.add_argument("--refusal", help="with --target refusal: the one answer every forget question is "
                                     "taught (default: one of a built-in set per question, by --seed)")
    p.add_argument("--key-positions", choices=KEY_POSITIONS,
                   help="where the forget keys are: the answer tokens (the paper's, the default), the subject's "
                        "tokens in the question (else its last token), the last prompt token, or every prompt token; "
                        "the retain keys follow (every prompt and answer position when the forget keys are in the "
                        "prompt)")
    for name in ("beta", "w_r", "rho", "c"):
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=float)
    p.add_argument("--beta-relative", action="store_true", default=None,
                   help="beta in units of the edited layer's mean output norm on the forget keys")
    p.add_argument("--no-alpha", dest="use_alpha", action="store_false", default=None,
                   help="switch the specificity weights off")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--forget-budget", type=_budget, metavar="N|none",
                   help="at most N forget key positions, a seeded sample (none: every key counts; default 20000)")
    p.add_argument("--retain-budget", type=_budget, metavar="N|none",
                   help="at most N retain key positions (none: every key counts; default 40000)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grom", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    edit = sub.add_parser("edit", help="compute a GROM edit and save it (patch.safetensors + edit.json)")
    _data_args(edit)
    edit.add_argument("--out", help="folder to write the edit into (required unless --plan)")
    edit.add_argument("--plan", action="store_true",
                      help="print the memory plan (bytes per stage, from the model's config) and exit")
    _json_arg(edit, "the result (folder, band, seconds, each layer's record; with --plan, the plan)")
    scores = sub.add_parser("scores", help="print the per-layer logit-lens scores S_l and the band")
    _data_args(scores)
    _json_arg(scores, "the scores S_l, F_l, R_l and the band")
    attack = sub.add_parser("attack", help="is it really gone? held-out probes and attacks on a saved edit")
    _model_and_sets(attack)
    attack.add_argument("--edit", required=True, help="a folder `python -m grom edit` wrote")
    attack.add_argument("--probes", help="probes file (rows with question, answer, fact); default: the "
                                         "benchmark's held-out probes (real-knowledge, or split 'probe' rows)")
    attack.add_argument("--attacks", default="all",
                        help="a comma list of attack names, or all; multi_hop and alias ask the questions written "
                             "for the bundled real-knowledge subjects the probes are about "
                             "(grom/robustness/written.py)")
    attack.add_argument("--reference", help="a retain model (a model folder or Hub id, never trained on the forget "
                                            "set): the depth attack then reports the Unlearning Depth Score (UDS); "
                                            "without it, the depth against the edit's own output")
    attack.add_argument("--fresh", action="store_true",
                        help="compute the unedited model's side again (its answers to the probe attacks, "
                             "relearning's control) instead of reading what an earlier run on the same weights "
                             "kept in GROM_UNEDITED_DIR (default ~/.cache/grom/unedited)")
    _json_arg(attack, "every attack's results")
    evaluate = sub.add_parser("evaluate", help="a benchmark's metrics of the model, a saved edit applied; "
                                               "TOFU also as OpenUnlearning's TOFU_EVAL.json")
    _model_args(evaluate)
    _benchmark_args(evaluate, required=True)
    evaluate.add_argument("--edit", help="a folder `python -m grom edit` wrote (else the model as it is)")
    evaluate.add_argument("--reference", help="the retain model (a model folder or Hub id): forget quality and "
                                              "privacy leakage against it")
    evaluate.add_argument("--max-examples", type=int, metavar="N", help="at most N examples of each set, evenly "
                                                                         "spread (default: all)")
    _json_arg(evaluate, "every row's metrics")
    evaluate.add_argument("--openunlearning", metavar="DIR",
                          help="TOFU and the demo: write the edited model's (else the model's) TOFU_EVAL.json and "
                               "TOFU_SUMMARY.json into DIR, as OpenUnlearning writes them")
    evaluate.add_argument("--retain-logs", metavar="FILE",
                          help="with --openunlearning: a retain model's TOFU_EVAL.json (OpenUnlearning's "
                               "retain_logs_path), for forget_quality and privleak (else --reference's row)")
    write = sub.add_parser("write", help="RWKU's name-only setting: the model writes passages and question/answer "
                                         "pairs about a bundled real-knowledge subject and its neighbours, as JSON "
                                         "lines for --benchmark name-only --source FILE")
    _model_args(write)
    write.add_argument("--subject", required=True, help="a bundled real-knowledge subject, e.g. the-solar-system")
    write.add_argument("--target", dest="subject", help=argparse.SUPPRESS)  # its name before 2026-11-30
    write.add_argument("--out", required=True, help="the JSON lines file to write (side, subject, kind, prompt, text)")
    for name, default, what in (("passages", 16, "passages about the subject"),
                                ("questions", 32, "questions about the subject (each answered by the model)"),
                                ("neighbours", 3, "other subjects written about for the retain side"),
                                ("neighbour-passages", 4, "passages about each neighbour"),
                                ("neighbour-questions", 8, "questions about each neighbour"),
                                ("seed", 0, "the sampling seed")):
        write.add_argument(f"--{name}", type=int, default=default, help=f"{what} (default {default})")
    write.add_argument("--protocol", choices=("rwku", "project"), default="rwku",
                       help="rwku (default): RWKU's sampling (top-k 50 on the passages, the questions at the model's "
                            "own generation config) and every question kept; project: this project's earlier "
                            "writing (no top-k, the questions sampled as the passages, filtered and deduplicated)")
    return parser


def write_command(args: argparse.Namespace) -> int:
    """`python -m grom write`: `grom.tasks.name_only.write_name_only` into --out, one JSON
    object a line, ready for `--benchmark name-only --split SUBJECT --source FILE`."""
    from grom.model.loading import load_model
    from grom.tasks.name_only import to_records, write_name_only, writing_config

    config = writing_config(args.protocol, passages=args.passages, questions=args.questions,
                            neighbours=args.neighbours, neighbour_passages=args.neighbour_passages,
                            neighbour_questions=args.neighbour_questions, seed=args.seed)
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                                  max_memory=args.max_memory)
    log = logging.getLogger("grom.write")
    rows = to_records(write_name_only(model, tokenizer, args.subject, config, progress=log.info))
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = {side: sum(r["side"] == side for r in rows) for side in ("forget", "retain")}
    print(f"{args.out}: {counts['forget']} texts about {args.subject}, {counts['retain']} about its neighbours")
    return 0


def config_from_args(args: argparse.Namespace) -> EditConfig:
    from grom.closed_form.config import PRESETS, EditConfig, keyed_at

    base = PRESETS[args.preset] if args.preset else EditConfig()
    fields = ("matrix", "layers", "k", "target", "refusal", "beta", "w_r", "rho", "c", "beta_relative",
              "use_alpha", "batch_size", "seed")
    changes = {f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}
    for f in ("forget_budget", "retain_budget"):
        value = getattr(args, f, None)
        if value is not None:
            changes[f] = None if value == "none" else value
    config = base.replace(**changes)
    where = getattr(args, "key_positions", None)
    return keyed_at(config, where) if where else config


def load_sets(args: argparse.Namespace):
    """(forget, retain, prompt_format) from a benchmark or from files."""
    from grom.data import load_benchmark
    from grom.tasks import load_custom_file

    if args.benchmark:
        bench = load_benchmark(args.benchmark, args.split, source=args.source)
        return bench.forget, bench.retain, bench.prompt_format
    if not (args.forget and args.retain):
        raise SystemExit("give --benchmark (and --split), or both --forget and --retain files")
    return load_custom_file(args.forget), load_custom_file(args.retain), None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.max_memory and not args.device_map:
        raise SystemExit("error: --max-memory needs --device-map (auto, balanced or sequential)")
    if args.command in ("attack", "evaluate", "write"):
        try:
            return {"attack": attack_command, "evaluate": evaluate_command, "write": write_command}[args.command](args)
        except (ValueError, FileNotFoundError) as err:  # bad input: a clear message, nothing written
            raise SystemExit(f"error: {err}") from None
    from grom.model import distributed

    # under torchrun (or in a process group already started): each rank edits with its share
    if distributed.init_from_env():
        try:
            return edit_or_scores(args)
        finally:
            distributed.shutdown()
    return edit_or_scores(args)


def edit_or_scores(args: argparse.Namespace) -> int:
    """`edit` and `scores`; under torch.distributed every rank computes, rank 0 writes."""
    from grom.closed_form.pipeline import prepare, score_prepared
    from grom.methods import get
    from grom.model.arch import unembedding
    from grom.model.distributed import rank
    from grom.model.editable import NotEditable
    from grom.model.loading import load_model

    config = config_from_args(args)
    if args.command == "edit" and not args.plan and not args.out:
        raise SystemExit("error: give --out FOLDER (where the edit is written), or --plan")
    forget, retain, fmt = load_sets(args)
    grom = get("grom")  # the method registry's row of GROM: what it can run on, its runner
    why = grom.can_run(None, argparse.Namespace(forget=forget, retain=retain))
    if why is not None:
        raise SystemExit(f"error: {why}")
    if fmt is not None and config.prompt_format is None:
        config = config.replace(prompt_format=fmt)
    if args.command == "edit" and plan_before_loading(args, config, forget, retain):
        return 0
    t0 = time.perf_counter()
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                                  max_memory=args.max_memory)
    load_s = time.perf_counter() - t0
    if args.command == "scores":
        prep = prepare(tokenizer, forget, retain, config, unembedding(model).shape[0])
        scores = score_prepared(model, prep, config)
        if rank() == 0:
            _report(args, scores.to_dict(), scores_table(scores))
        return 0
    try:
        edit = grom.run(model, tokenizer, forget, retain, config)
    except NotEditable as err:  # quantized or offloaded band weights: refused before any forward pass
        raise SystemExit(f"error: {err}") from None
    if rank() != 0:
        return 0
    out = edit.save(Path(args.out))
    timings = {"load": load_s, **edit.timings}
    doc = {"out": str(out), "model": args.model, "band": edit.band, "timings": timings,
           "patch_norm": edit.patch_norm(), "n_forget": len(forget), "n_retain": len(retain),
           "layers": [r.to_dict() for r in edit.layers]}
    _report(args, doc, edit_summary(edit, out, args.model, len(forget), len(retain), timings))
    return 0


def _report(args: argparse.Namespace, doc: dict, summary: str) -> None:
    """`summary` on stdout, or `doc` as JSON instead with a bare --json; --json FILE writes
    `doc` there as well."""
    text = json.dumps(_json_safe(doc), indent=2) if args.json else ""
    if args.json == "-":
        print(text)
        return
    print(summary)
    if args.json:
        Path(args.json).write_text(text)


def scores_table(scores) -> str:
    """The layer scores, a row a layer (the band's marked *), and the band."""
    lines = [f"{'layer':>5} {'S_l':>10} {'F_l':>10} {'R_l':>10}"]
    for l, (s, f, r) in enumerate(zip(scores.S, scores.F, scores.R)):
        mark = "  *" if l in scores.band else ""
        lines.append(f"{l:>5} {s:>10.4f} {f:>10.4f} {r:>10.4f}{mark}")
    lines.append(f"band (k={scores.k}): {list(scores.band)}")
    return "\n".join(lines)


def layers_text(layers) -> str:
    """[11, 12, 13] -> '11-13'; [3, 5] -> '3, 5'."""
    layers = list(layers)
    if len(layers) > 1 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ", ".join(map(str, layers))


def _band_text(edit: Edit) -> str:
    cfg = edit.settings
    if not edit.band:
        return "the LM head"
    how = "given" if cfg.layers is not None else f"automatic: the best window of {cfg.k} by the layer scores S_l"
    return f"layers {layers_text(edit.band)} ({how})"


def edit_summary(edit: Edit, out: Path, model: str, n_forget: int, n_retain: int, timings: dict) -> str:
    """What `python -m grom edit` did, for a reader: where it went, the band, the times and
    each edited matrix's record (beta, the ridge mu, the keys, how large the patch is)."""
    cfg = edit.settings
    rows = [("written", f"{out} (patch.safetensors, edit.json)"), ("model", model),
            ("data", f"{n_forget} forget and {n_retain} retain examples"),
            ("edit", f"{cfg.matrix}, target {cfg.target}, {_band_text(edit)}"),
            ("seconds", "  ".join(f"{k} {v:.2f}" for k, v in timings.items())),
            ("|P|", f"{edit.patch_norm():.4g} (Frobenius, every matrix together)")]
    lines = ["GROM edit"] + [f"  {k:<8} {v}" for k, v in rows] + [""]
    w = max([len("matrix"), *(len(r.param_name) for r in edit.layers)])
    lines.append(f"  {'matrix':<{w}} {'beta':>9} {'mu':>9} {'forget keys':>12} {'retain keys':>12} {'|P|/|W|':>9}")
    for r in edit.layers:
        ratio = r.patch_norm / r.weight_norm if r.weight_norm else float("nan")
        lines.append(f"  {r.param_name:<{w}} {r.beta:>9.4g} {r.mu:>9.3g} {r.n_forget_keys:>12} "
                     f"{r.n_retain_keys:>12} {ratio:>9.3g}")
    return "\n".join(lines)


def plan_before_loading(args: argparse.Namespace, config: EditConfig, forget, retain) -> bool:
    """The memory plan from the model's config and tokenizer alone (no weights loaded):
    printed with --plan (True: stop there); else a clear exit when it will not fit on the
    device. An automatic band is planned at its width k (the layers do not change the
    bytes)."""
    from transformers import AutoConfig, AutoTokenizer

    from grom.closed_form.memory_plan import WillNotFit, check_fits, free_bytes, headroom_for, plan_edit
    from grom.model.distributed import rank
    from grom.model.loading import resolve_device, resolve_model_name
    from grom.model.sharding import sharded_room

    name = resolve_model_name(args.model)
    model_config = AutoConfig.from_pretrained(name, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    p = plan_edit(model_config, tokenizer, forget, retain, config, args.dtype)
    if args.plan:
        if rank() == 0:
            doc = {"settings": p.settings, "stages": p.stages, "parts": p.parts, "peak": p.peak,
                   "peak_stage": p.peak_stage}
            planned = ", ".join(f"{k} {v}" for k, v in p.settings.items())
            _report(args, doc, f"memory plan for: {planned}\n\n{p.describe()}\n\n"
                               f"peak: {p.peak / 2**30:.3f} GiB at stage {p.peak_stage!r}")
        return True
    # sharded: every device the map may use, the weights beyond the budgets on disk (grom.model.sharding)
    where = args.device_map or resolve_device(args.device)
    free = sharded_room(p.stages["weights"], args.device_map, args.max_memory, free_bytes) if args.device_map \
        else free_bytes(where)
    try:
        check_fits(p, free, model_config, config, headroom=headroom_for(where))
    except WillNotFit as err:
        raise SystemExit(f"error: {err}") from None
    return False


def attack_sets(args: argparse.Namespace):
    """(probes, fitted questions, holdout, prompt format) for `attack`: the probes of --probes, else
    the benchmark's held-out probes (eval_sets["probes"]: real-knowledge, or the rows of
    split "probe" of custom files), else the --forget file's rows of split "probe"; never
    the fitted questions themselves. The fitted questions are the forget set; the holdout
    (membership attacks) the benchmark's neighbours or general questions, else the
    --retain file's rows (`grom.robustness.membership.holdout_of`)."""
    from grom.data import load_benchmark
    from grom.robustness.membership import holdout_of
    from grom.robustness.probes import probes_from_examples, read_probes
    from grom.tasks import load_custom_file

    if args.benchmark:
        bench = load_benchmark(args.benchmark, args.split, source=args.source)
        forget, fmt = bench.forget, bench.prompt_format
        held_out = probes_from_examples(bench.eval_sets.get("probes", ()))
        holdout = holdout_of(bench.eval_sets, bench.retain)
    elif args.forget:
        forget, fmt = load_custom_file(args.forget, split="forget"), None
        held_out = _probe_rows(args.forget)
        holdout = holdout_of({}, load_custom_file(args.retain, split="retain") if args.retain else ())
    else:
        raise SystemExit("give --benchmark (and --split), or a --forget file (the questions the edit was fitted on)")
    probes = read_probes(args.probes) if args.probes else held_out
    if not probes:
        raise SystemExit("no held-out probes: give --probes FILE (rows with question, answer, fact), or a "
                         "benchmark that holds them (real-knowledge, or custom rows of split 'probe')")
    return probes, forget, holdout, fmt


def _probe_rows(path: str) -> tuple:
    """The probes among a forget file's rows (split "probe"); none without such rows."""
    from grom.data.readers import read_rows
    from grom.robustness.probes import read_probes

    if not any(str(r.data.get("split", "")).strip().lower() == "probe" for r in read_rows(path)):
        return ()
    return read_probes(path)


def attack_command(args: argparse.Namespace) -> int:
    """`python -m grom attack`: the suite on a saved edit; prints a table, writes --json."""
    from grom.edit import Edit
    from grom.model.loading import load_model
    from grom.robustness.kept import UneditedSide, unedited_root
    from grom.robustness.suite import attack_names, check_edit_fits, run_attacks

    names = attack_names(args.attacks)  # an unknown name: refused before anything is loaded
    edit = Edit.load(Path(args.edit))
    probes, fitted, holdout, fmt = attack_sets(args)
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                                  max_memory=args.max_memory)
    check_edit_fits(model, edit)
    reference = None
    if args.reference and "depth" in names:
        reference, _ = load_model(args.reference, device=args.device, dtype=args.dtype, device_map=args.device_map,
                                  max_memory=args.max_memory)
    kept = None if args.fresh or unedited_root() is None else UneditedSide(model, tokenizer)
    results = run_attacks(model, tokenizer, edit, probes, fitted=fitted, holdout=holdout, attacks=names, fmt=fmt,
                          progress=lambda f, msg: logging.getLogger("grom.attack").info("%3.0f%% %s", 100 * f, msg),
                          reference=reference, kept=kept)
    if kept is not None and (kept.read or kept.written):
        logging.getLogger("grom.attack").info(
            "the unedited model's side: %d result%s read from %s (an earlier run on these weights), %d kept there "
            "(--fresh computes them again)", kept.read, "s" * (kept.read != 1), kept.root, kept.written)
    doc = {"model": args.model, "edit": str(args.edit), "method": edit.method, "n_probes": len(probes),
           "n_fitted": len(fitted), "n_holdout": len(holdout), "reference": args.reference,
           "attacks": {n: r.to_dict() for n, r in results.items()},
           "unedited_side": None if kept is None else {"dir": str(kept.root), "read": kept.read,
                                                       "written": kept.written}}
    table = [f"{'attack':<20} {'base':>6} {'edited':>6} {'n':>4} {'seconds':>8}"]
    table += [f"{n:<20} {r.base:>6.3f} {r.edited:>6.3f} {r.n:>4} {r.seconds:>8.1f}" for n, r in results.items()]
    _report(args, doc, "\n".join(table))
    return 0


def evaluate_command(args: argparse.Namespace) -> int:
    """`python -m grom evaluate`: the benchmark's report (`grom.eval.evaluate`) of the model
    with --edit applied (row "Edited"; else the model's own, "Base") and of --reference
    ("Retain model"); prints the table, writes --json and, for a TOFU-task benchmark,
    --openunlearning (`grom.eval.openunlearning`)."""
    from grom.data import load_benchmark
    from grom.edit import Edit
    from grom.eval import evaluate
    from grom.eval.openunlearning import write_openunlearning
    from grom.eval.results import BASE, EDITED
    from grom.model.loading import load_model
    from grom.robustness.suite import check_edit_fits

    if args.retain_logs and not args.openunlearning:
        raise SystemExit("error: --retain-logs goes with --openunlearning DIR")
    if args.retain_logs and not Path(args.retain_logs).is_file():
        raise FileNotFoundError(f"no file {args.retain_logs} (--retain-logs: a retain model's TOFU_EVAL.json)")
    edit = Edit.load(Path(args.edit)) if args.edit else None
    bench = load_benchmark(args.benchmark, args.split, source=args.source)
    if args.openunlearning and bench.task != "tofu":
        raise ValueError(f"--openunlearning writes TOFU's log: {args.benchmark} is evaluated by the "
                         f"{bench.task!r} task")
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, device_map=args.device_map,
                                  max_memory=args.max_memory)
    if edit is not None:
        check_edit_fits(model, edit)
    reference = None
    if args.reference:
        ref_device = args.device if not args.device_map else "auto"
        reference = load_model(args.reference, device=ref_device, dtype=args.dtype)  # (model, its tokenizer)
    log = logging.getLogger("grom.evaluate")
    report = evaluate(model, tokenizer, bench, edit=edit, reference=reference, max_examples=args.max_examples,
                      include_base=edit is None, progress=lambda f, msg: log.info("%3.0f%% %s", 100 * f, msg))
    _report(args, report.to_dict(), report.table().T.to_string(float_format=lambda v: f"{v:.4f}"))
    if args.openunlearning:
        paths = write_openunlearning(report, args.openunlearning, EDITED if edit is not None else BASE,
                                     benchmark=bench, retain_logs=args.retain_logs)
        if args.json != "-":  # stdout holds the JSON alone
            print("OpenUnlearning log: " + ", ".join(str(p) for p in paths))
    return 0


def _json_safe(value):
    """NaN (an attack that made no probe) as null, so the file is strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
