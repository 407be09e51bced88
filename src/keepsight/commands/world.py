"""``keepsight world build | train | eval``: the synthetic world, its base model, and scoring on it."""

from __future__ import annotations

import contextlib
import copy
import dataclasses

from ..atomic import check_output_dir, check_output_file, write_output_json
from ..determinism import DEFAULT_THREADS, configure
from ..inference import Decoders
from ..models import load_checkpoint
from ..models.withhold import image_withheld
from ..profiles import DemoProfile
from ..pvm import load_pvm
from ..train.lora_control import apply_lora
from ..world.balanced import balanced_yes_no
from ..world.base import BASE_KIND, RECIPES, STAGES, finalize, stage_done, train_base, train_stage
from ..world.dataset import build_world, check_in_memory, generate_scenes
from ..world.evaluate import (
    HISTORY_LENGTHS,
    evaluate_after_description,
    evaluate_descriptions,
    evaluate_history,
    evaluate_open,
    evaluate_yes_no,
    oracle_recovery,
)
from ..world.models import TINY_CHECKPOINTS, TINY_KIND, save_tiny_checkpoint
from ..world.tasks import WorldSamples
from .method_options import add_method_options, baseline_choice
from .options import (
    nonneg_int,
    output_file_args,
    placement_args,
    positive_float,
    positive_int,
    read_samples,
    threads,
    training_args,
    world_args,
    world_from_args,
)


def add_parser(sub) -> None:
    world = sub.add_parser("world", help="the synthetic world").add_subparsers(dest="world_command", required=True)
    b = world.add_parser("build", help="write scenes as PNG + JSONL")
    b.add_argument("--out", required=True)
    b.add_argument("--n", type=positive_int, required=True, help="number of scenes")
    b.add_argument("--seed", type=nonneg_int, default=0)
    b.add_argument("--objects", type=positive_int, help="fix the object count of every scene")
    b.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    world_args(b)
    b.set_defaults(func=run_build)

    t = world.add_parser("train", help="build a base VLM in stages (lm, vision, align, instruct) with the demo's "
                          "recipe (keepsight.world.base.BASE_RECIPE; --recipe grounded: GROUNDED_RECIPE, regime: "
                          "REGIME_RECIPE)")
    t.add_argument("--preset", help="the tiny preset (default: the recipe's; tiny-llava, tiny-llava-r300 for regime)")
    t.add_argument("--out", required=True)
    t.add_argument("--data", help="a world directory from `world build` (default: generate in memory)")
    t.add_argument("--n", type=positive_int, default=DemoProfile.n_train, help="training scenes when --data is not "
                   "given (default: the demo's, %(default)s)")
    t.add_argument("--seed", type=nonneg_int, default=0)
    t.add_argument("--recipe", default="base", choices=sorted(RECIPES),
                   help="base: the demo's recipe (BASE_RECIPE); grounded: with a cell-lookup stage before instruct and "
                   "a count head on the tower (GROUNDED_RECIPE; keepsight.world.base says what it measured); regime: "
                   "the grounded recipe with the language model's RoPE base at 300 (REGIME_RECIPE), where the history "
                   "regime is one that access to the image limits")
    t.add_argument("--stage", default="all", choices=["all", *STAGES])
    t.add_argument("--steps-scale", type=positive_float, default=1.0, help="multiply every stage's step count")
    t.add_argument("--batch-size", type=positive_int, help="override every stage's batch size")
    t.add_argument("--threads", type=threads, default=DEFAULT_THREADS, help="intra-op threads, or auto (the cores "
                   f"free when it starts); default {DEFAULT_THREADS}: a base repeats bit for bit with the same thread "
                   "count, package versions and CPU kind, and a base directory is resumed only under the settings it "
                   "was started with")
    training_args(t)
    world_args(t)
    t.set_defaults(func=run_train)

    tn = world.add_parser("tiny", help="write a tiny random checkpoint of a preset (to try the loader and methods)")
    tn.add_argument("--preset", required=True, choices=list(TINY_CHECKPOINTS))
    tn.add_argument("--out", required=True)
    tn.add_argument("--seed", type=nonneg_int, default=0)
    tn.set_defaults(func=run_tiny)

    e = world.add_parser("eval", help="score a trained model on a world directory")
    e.add_argument("--model", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--limit", type=positive_int, help="evaluate only the first N scenes")
    e.add_argument("--pvm", help="a PVM adapter directory to attach before evaluating")
    e.add_argument("--lora", help="a LoRA adapter directory (keepsight lora train) to merge before evaluating")
    e.add_argument("--history", action="store_true", help="also the history regime: one visual yes/no question per "
                   f"scene after 0 .. {HISTORY_LENGTHS[-1]} turns of other questions, with and without the image shown "
                   "again just before it (the oracle), and the same question after the model's own description of "
                   "the image (with and without the oracle), each with the drop and the oracle's recovery paired by "
                   "scene")
    e.add_argument("--balanced", action="store_true", help="also yes/no on the prior-balanced set: each question "
                   "asked of its own scene and of another where the same words have the other answer, so a model that "
                   "does not see the image scores exactly 0.5 (keepsight.world.balanced)")
    e.add_argument("--withhold-image", action="store_true", help="mask the image's tokens out of the language model's "
                   "attention (PVM's mechanism control: what it knows of the image then comes from PVM's memory)")
    output_file_args(e, "write the scores as JSON here")
    placement_args(e)
    add_method_options(e, ("autoregressive",))  # a baseline combines with --pvm or --lora
    e.set_defaults(func=run_eval)


def run_build(args) -> int:
    path = build_world(args.out, world_from_args(args), args.n, seed=args.seed, n_objects=args.objects,
                       overwrite=args.overwrite)
    print(f"wrote {args.n} scenes to {path}")
    return 0


def run_tiny(args) -> int:
    check_output_dir(args.out, "--out", kinds=(TINY_KIND,))
    path = save_tiny_checkpoint(args.preset, args.out, seed=args.seed)
    print(f"wrote a random {args.preset} checkpoint to {path} (untrained: for trying keepsight, not for results)")
    return 0


def run_train(args) -> int:
    check_output_dir(args.out, "--out", kinds=(BASE_KIND,), inputs=[args.data])
    configure(args.threads)
    if args.data:
        samples = read_samples(args.data)
    else:
        cfg = world_from_args(args)
        check_in_memory(cfg, args.n)
        samples = WorldSamples.from_scenes(cfg, generate_scenes(cfg, args.n, seed=args.seed))
    recipe = RECIPES[args.recipe]
    tc = copy.deepcopy(dataclasses.replace(recipe, preset=args.preset or recipe.preset, seed=args.seed))
    for stage in tc.stages:
        st = getattr(tc, stage)
        st.steps = max(1, round(st.steps * args.steps_scale))
        if args.batch_size:
            st.batch_size = args.batch_size
    if args.stage == "all" and args.stop_after is None:
        summaries = train_base(args.out, tc, samples, grad_accum=args.grad_accum, overwrite=args.overwrite)
    else:
        summaries = {}
        for s in tc.stages if args.stage == "all" else (args.stage,):
            summaries[s] = train_stage(s, args.out, tc, samples, stop_after=args.stop_after,
                                       grad_accum=args.grad_accum, overwrite=args.overwrite)
            if summaries[s] is None:
                print(f"stage {s} stopped at step {args.stop_after}; run the same command to resume")
                return 0
        if all(stage_done(args.out, s) for s in tc.stages):
            finalize(args.out)
    for s, v in summaries.items():
        if v:
            print(f"{s:9s} loss {v['first_loss']:.4f} -> {v['last_loss']:.4f}")
    return 0


def run_eval(args) -> int:
    if args.pvm and args.lora:
        raise ValueError("--pvm and --lora are two different arms; evaluate them one at a time")
    if args.out:
        check_output_file(args.out, "--out", inputs=[args.model, args.data, args.pvm, args.lora],
                          overwrite=args.overwrite, kind="world-scores")
    baseline, settings = baseline_choice(args)
    method = Decoders([(baseline, settings)], family="autoregressive") if baseline else None  # checked before loading
    samples = read_samples(args.data, args.limit)
    model, processor = load_checkpoint(args.model, dtype=args.dtype, device=args.device, expect="autoregressive")
    if args.pvm:
        load_pvm(model, args.pvm)
    if args.lora:
        model = apply_lora(model, args.lora)
    with (method.applied(model) if method is not None else contextlib.nullcontext(),
          image_withheld(model) if args.withhold_image else contextlib.nullcontext()):
        yn, _ = evaluate_yes_no(model, processor, samples, decode=method is not None)
        res = {"yes_no": yn, "open": evaluate_open(model, processor, samples),
               "descriptions": evaluate_descriptions(model, processor, samples)}
        if args.balanced:
            res["yes_no_balanced"] = evaluate_yes_no(model, processor, samples, decode=method is not None,
                                                     items=balanced_yes_no(samples.scenes, samples.config))[0]
        if args.history:
            res["history"] = evaluate_history(model, processor, samples, probe=method is None)
            res["oracle"] = evaluate_history(model, processor, samples, probe=False, reinsert_image=True)
            res["oracle_recovery"] = oracle_recovery(res["oracle"], res["history"])
            res["after_description"] = evaluate_after_description(model, processor, samples,
                                                                  descriptions=res["descriptions"]["texts"])
    if method is not None:
        obj = method.get(baseline)
        res["baseline"] = {"name": baseline, "config": dataclasses.asdict(obj.config), "stats": obj.stats()}
        print(f"{baseline}: {obj.stats()}")
    for c, v in yn["categories"].items():
        print(f"{c:10s} acc {v['acc']:.3f} acc+ {v['acc_plus']:.3f}")
    if args.balanced:
        b = res["yes_no_balanced"]
        print(f"prior-balanced yes/no {b['overall_acc']:.3f} (a model that does not see the image: 0.500); "
              + " ".join(f"{c} {v['acc']:.3f}" for c, v in b["categories"].items()))
    ch = res["descriptions"]["chair"]
    print(f"CHAIRi {ch['chair_i']:.3f} CHAIRs {ch['chair_s']:.3f} object recall {ch['object_recall']:.3f} "
          f"exact recall {ch['exact_recall']:.3f}")
    rows = res["descriptions"]["by_index"]
    print("colour by index: " + " ".join(f"{r['colour']:.2f}" for r in rows))
    print("counter-prior colour by index: " + " ".join("-" if r["colour_counter_prior"] is None
                                                       else f"{r['colour_counter_prior']:.2f}" for r in rows))
    if args.history:
        for name in ("history", "oracle"):
            h = res[name]
            d = h["drop"]
            accs = " ".join(f"{k}:{v['acc']:.3f}" for k, v in h["by_length"].items())
            print(f"{name:8s} accuracy by turns of history {accs}; drop {d['diff']:.3f} [{d['low']:.3f}, {d['high']:.3f}]")
        rec, long = res["oracle_recovery"], str(res["history"]["lengths"][-1])
        gain = res["oracle"]["by_length"][long]["acc"] - res["history"]["by_length"][long]["acc"]
        share = "-" if rec["recovered_share"] is None else f"{rec['recovered_share']:.2f}"
        print(f"oracle after {long} turns: {gain:+.3f} [{rec['recovered_interval'][0]:.3f}, "
              f"{rec['recovered_interval'][1]:.3f}] over the base, {share} of its drop")
        ad = res["after_description"]
        d, r = ad["drop"], ad["recovery"]
        share = "-" if ad["recovered_share"] is None else f"{ad['recovered_share']:.2f}"
        print(f"after its own description ({ad['description_words']:.0f} words): accuracy {ad['none']['acc']:.3f} -> "
              f"{ad['description']['acc']:.3f}, drop {d['diff']:.3f} [{d['low']:.3f}, {d['high']:.3f}]; oracle "
              f"{ad['oracle']['acc']:.3f}, {r['diff']:+.3f} [{r['low']:.3f}, {r['high']:.3f}] over it, {share} of the drop")
    if args.out:
        write_output_json(args.out, res, "world-scores")
    return 0

