"""``keepsight`` command line. Heavy modules are imported inside the handlers."""

from __future__ import annotations

import argparse
import os
import sys


def _world_config(args):
    from .world.config import world_config

    overrides = {}
    if getattr(args, "image_size", None):
        overrides["image_size"] = args.image_size
    if getattr(args, "grid", None):
        overrides["grid"] = tuple(args.grid)
    if getattr(args, "max_objects", None):
        overrides["max_objects"] = args.max_objects
    return world_config(args.difficulty, **overrides)


def cmd_world_build(args) -> int:
    from .world.dataset import build_world

    cfg = _world_config(args)
    path = build_world(args.out, cfg, args.n, seed=args.seed, n_objects=args.objects, overwrite=args.overwrite)
    print(f"wrote {args.n} scenes to {path}")
    return 0


def cmd_world_train(args) -> int:
    from .world.data import WorldSamples
    from .world.dataset import generate, read_world
    from .world.train import STAGES, TrainConfig, finalize, stage_done, train_base, train_stage

    if args.data:
        cfg, records = read_world(args.data)
        samples = WorldSamples.from_records(cfg, records)
    else:
        cfg = _world_config(args)
        samples = WorldSamples.from_scenes(cfg, generate(cfg, args.n, seed=args.seed))
    tc = TrainConfig(preset=args.preset, seed=args.seed)
    for stage in STAGES:
        st = getattr(tc, stage)
        st.steps = max(1, round(st.steps * args.steps_scale))
        if args.batch_size:
            st.batch_size = args.batch_size
    if args.stage == "all" and args.stop_after is None:
        summaries = train_base(args.out, tc, samples, grad_accum=args.grad_accum)
    else:
        stages = STAGES if args.stage == "all" else (args.stage,)
        summaries = {}
        for s in stages:
            summaries[s] = train_stage(s, args.out, tc, samples, stop_after=args.stop_after,
                                       grad_accum=args.grad_accum)
            if summaries[s] is None:
                print(f"stage {s} stopped at step {args.stop_after}; run the same command to resume")
                return 0
        from .world.train import STAGES as ALL
        from .world.train import finalize, stage_done

        if all(stage_done(args.out, s) for s in ALL):
            finalize(args.out)
    for s, v in summaries.items():
        if v:
            print(f"{s:9s} loss {v['first_loss']:.4f} -> {v['last_loss']:.4f}")
    return 0


def cmd_world_eval(args) -> int:
    from .checkpoint import load_checkpoint
    from .world.data import WorldSamples
    from .world.dataset import read_world
    from .world.evaluate import evaluate_descriptions, evaluate_open, evaluate_yes_no

    cfg, records = read_world(args.data)
    samples = WorldSamples.from_records(cfg, records[: args.limit] if args.limit else records)
    model, processor = load_checkpoint(args.model, dtype=args.dtype, device=args.device, expect="autoregressive")
    if args.pvm and args.lora:
        raise ValueError("--pvm and --lora are two different arms; evaluate them one at a time")
    if args.pvm:
        from .pvm import load_pvm

        load_pvm(model, args.pvm)
    if args.lora:
        from .train.lora_control import apply_lora

        model = apply_lora(model, args.lora)
    yn, _ = evaluate_yes_no(model, processor, samples)
    res = {"yes_no": yn, "open": evaluate_open(model, processor, samples),
           "descriptions": evaluate_descriptions(model, processor, samples)}
    for c, v in yn["categories"].items():
        print(f"{c:10s} acc {v['acc']:.3f} acc+ {v['acc_plus']:.3f}")
    ch = res["descriptions"]["chair"]
    print(f"CHAIRi {ch['chair_i']:.3f} CHAIRs {ch['chair_s']:.3f} object recall {ch['object_recall']:.3f} "
          f"exact recall {ch['exact_recall']:.3f}")
    rows = res["descriptions"]["by_index"]
    print("colour by index: " + " ".join(f"{r['colour']:.2f}" for r in rows))
    print("counter-prior colour by index: " + " ".join("-" if r["colour_counter_prior"] is None
                                                       else f"{r['colour_counter_prior']:.2f}" for r in rows))
    if args.out:
        from .atomic import write_json

        write_json(args.out, res)
    return 0


def cmd_diagnose(args) -> int:
    from pathlib import Path

    from .atomic import write_json
    from .checkpoint import load_checkpoint
    from .report.plots import plot_diagnosis
    from .world.data import WorldSamples
    from .world.dataset import read_world
    from .world.diagnose import diagnose

    cfg, records = read_world(args.data)
    samples = WorldSamples.from_records(cfg, records[: args.limit] if args.limit else records)
    model, processor = load_checkpoint(args.model, dtype=args.dtype, device=args.device, expect="autoregressive")
    diag = diagnose(model, processor, samples, args.prompt, args.max_new_tokens, args.batch_size)
    out = Path(args.out)
    write_json(out / "diagnosis.json", diag)
    plot_diagnosis(diag, out)
    slope = "n/a" if diag["slope"] is None else f"{diag['slope']:.3f}"
    print(f"Omega_V slope (log-log, generated steps) {slope}; TVR plateau {diag['tvr_plateau']:.2f}; "
          f"mean LogitLens convergence layer {diag['convergence_layer_mean']:.2f}; wrote {out}")
    return 0


def _read_samples(path):
    from .world.data import WorldSamples
    from .world.dataset import read_world

    cfg, records = read_world(path)
    return WorldSamples.from_records(cfg, records)


def _print_gates(report: dict) -> None:
    for key, v in report.items():
        print(f"layer {key}: gate {v['gate_mean']:+.4f}, ||PVM|| / ||FFN|| {v['relative_norm']:.4f}")


def cmd_pvm_train(args) -> int:
    from .pvm import PVMConfig

    samples = _read_samples(args.data)
    if args.stage == "grpo":
        from .train.pvm_grpo import GRPOTrainConfig, train_pvm_grpo

        if not args.init:
            raise ValueError("--stage grpo needs --init: the stage-1 adapter directory it starts from")
        cfg = GRPOTrainConfig(steps=args.steps or 100, lr=args.lr or 2e-4, gate_lr=args.gate_lr or 2e-3,
                              beta=args.beta, num_generations=args.num_generations,
                              prompts_per_step=args.prompts_per_step, tasks=args.tasks, seed=args.seed,
                              max_completion_length=args.max_completion_length)
        summary = train_pvm_grpo(args.model, args.init, samples, args.out, cfg, stop_after=args.stop_after,
                                 grad_accum=args.grad_accum)
        if summary is None:
            print(f"stopped at step {args.stop_after}; run the same command to resume")
            return 0
        _print_gates(summary["after"])
        first, last = summary["first_reward"] or {}, summary["last_reward"] or {}
        print(f"reward {first.get('reward', float('nan')):.3f} -> {last.get('reward', float('nan')):.3f}; "
              f"adapter in {args.out}")
        return 0
    from .train.pvm_sft import PVMTrainConfig, train_pvm_sft

    if args.init:
        raise ValueError("--init is for --stage grpo; stage 1 (sft) starts a new adapter")
    layers = args.layers if args.layers else "strided"
    pvm_cfg = PVMConfig(layers=layers, latent_dim=args.latent_dim, heads=args.heads, gate=args.gate)
    train_cfg = PVMTrainConfig(steps=args.steps or 600, lr=args.lr or 1e-3, gate_lr=args.gate_lr or 1e-2,
                               batch_size=args.batch_size, seed=args.seed)
    summary = train_pvm_sft(args.model, samples, args.out, pvm_cfg, train_cfg, stop_after=args.stop_after,
                            grad_accum=args.grad_accum)
    if summary is None:
        print(f"stopped at step {args.stop_after}; run the same command to resume")
        return 0
    _print_gates(summary["after"])
    print(f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; adapter in {args.out}")
    return 0


def cmd_lora_train(args) -> int:
    from .pvm import PVMConfig
    from .train.lora_control import LoRATrainConfig, train_lora_control

    layers = args.layers if args.layers else "strided"
    pvm_cfg = PVMConfig(layers=layers, latent_dim=args.latent_dim)
    cfg = LoRATrainConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size, seed=args.seed)
    summary = train_lora_control(args.model, _read_samples(args.data), args.out, pvm_cfg, cfg,
                                 stop_after=args.stop_after, grad_accum=args.grad_accum)
    if summary is None:
        print(f"stopped at step {args.stop_after}; run the same command to resume")
        return 0
    print(f"LoRA rank {summary['rank']} on layers {summary['layers']}: {summary['lora_parameters']} parameters "
          f"(PVM: {summary['pvm_parameters']}); loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; "
          f"adapter in {args.out}")
    return 0


def cmd_bridge_train(args) -> int:
    from .train.bridge import BridgeTrainConfig, train_bridge
    from .world.train import StageConfig

    defaults = {1: (200, 2e-3), 2: (4000, 2e-3)}[args.phase]
    cfg = BridgeTrainConfig(phase=args.phase, bridge=args.bridge, seed=args.seed,
                            stage=StageConfig(args.steps or defaults[0], args.lr or defaults[1], args.batch_size))
    summary = train_bridge(args.model, _read_samples(args.data), args.out, cfg, stop_after=args.stop_after,
                           grad_accum=args.grad_accum)
    if summary is None:
        print(f"stopped at step {args.stop_after}; run the same command to resume")
        return 0
    print(f"phase {args.phase}: {summary['bridge']['kind']} bridge ({summary['bridge_parameters']:,d} parameters), "
          f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; model in {args.out}")
    return 0


def cmd_diffusion_train(args) -> int:
    from .train.diffusion import DiffusionTrainConfig, train_diffusion

    cfg = DiffusionTrainConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                               answer_length=args.answer_length, seed=args.seed)
    summary = train_diffusion(args.base, _read_samples(args.data), args.out, cfg, stop_after=args.stop_after,
                              grad_accum=args.grad_accum)
    if summary is None:
        print(f"stopped at step {args.stop_after}; run the same command to resume")
        return 0
    print(f"masked-diffusion loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; model in {args.out}")
    return 0


def cmd_bench(args) -> int:
    if args.name == "probe-overhead":
        from .bench.probe_overhead import run

        run(args.out, batch=args.batch, new_tokens=args.new_tokens, repeats=args.repeats)
    elif args.name == "pvm-decode":
        from .bench.pvm_decode import run

        run(args.out, batch=args.batch, new_tokens=args.new_tokens, repeats=args.repeats)
    elif args.name == "bridge-memory":
        from .bench.bridge_memory import run

        run(args.out, mem_limit_gib=args.mem_limit_gib)
    elif args.name == "needle":
        from .bench.needle import run

        run(args.out)
    elif args.name == "diffusion":
        from .bench.diffusion import run

        run(args.out, repeats=args.repeats)
    elif args.name == "scan":
        from .bench.scan import run

        run(args.out)
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    run_demo("smoke" if args.smoke else args.profile, runs_dir=args.runs, name=args.name, retrain=args.retrain)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keepsight", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def world_args(sp):
        sp.add_argument("--difficulty", default="default", help="world preset: easy | default | hard")
        sp.add_argument("--image-size", type=int, help="override the preset's image size (pixels)")
        sp.add_argument("--grid", type=int, nargs=2, metavar=("ROWS", "COLS"), help="override the grid")
        sp.add_argument("--max-objects", type=int, help="override the most objects per scene")

    def placement_args(sp):  # commands that load --model for inference
        from .checkpoint import DTYPE_CHOICES

        sp.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                        help="weights dtype (auto: bf16 on a CUDA GPU that has it, else fp16 there, fp32 on CPU)")
        sp.add_argument("--device", default="auto", help="auto (cuda when present) | cpu | cuda | cuda:N | mps")

    def grad_accum_arg(sp):  # training commands: --batch-size is the global batch of one optimizer step
        sp.add_argument("--grad-accum", type=int, default=1, help="gradient-accumulation steps: the batch size "
                        "(global, per optimizer step) is split over them and the `accelerate launch` processes")
        sp.add_argument("--precision", default="no", choices=["no", "bf16", "fp16"],
                        help="mixed precision (autocast over fp32 master weights); bf16 on GPUs that have it")
        sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                        help="auto: each process's GPU when there is one (accelerate assigns them), else the CPU")

    world = sub.add_parser("world", help="the synthetic world").add_subparsers(dest="world_command", required=True)
    b = world.add_parser("build", help="write scenes as PNG + JSONL")
    b.add_argument("--out", required=True)
    b.add_argument("--n", type=int, required=True, help="number of scenes")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--objects", type=int, help="fix the object count of every scene")
    b.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    world_args(b)
    b.set_defaults(func=cmd_world_build)

    t = world.add_parser("train", help="build a base VLM in stages (lm, vision, align, instruct)")
    t.add_argument("--preset", default="tiny-llava")
    t.add_argument("--out", required=True)
    t.add_argument("--data", help="a world directory from `world build` (default: generate in memory)")
    t.add_argument("--n", type=int, default=4000, help="training scenes when --data is not given")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--stage", default="all", choices=["all", "lm", "vision", "align", "instruct"])
    t.add_argument("--steps-scale", type=float, default=1.0, help="multiply every stage's step count")
    t.add_argument("--batch-size", type=int, help="override every stage's batch size")
    t.add_argument("--stop-after", type=int, help="stop each stage after this many steps (resume later)")
    grad_accum_arg(t)
    world_args(t)
    t.set_defaults(func=cmd_world_train)

    e = world.add_parser("eval", help="score a trained model on a world directory")
    e.add_argument("--model", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--limit", type=int, help="evaluate only the first N scenes")
    e.add_argument("--pvm", help="a PVM adapter directory to attach before evaluating")
    e.add_argument("--lora", help="a LoRA adapter directory (keepsight lora train) to merge before evaluating")
    e.add_argument("--out", help="write the scores as JSON here")
    placement_args(e)
    e.set_defaults(func=cmd_world_eval)

    g = sub.add_parser("diagnose", help="visual attention mass, TVR and LogitLens while generating")
    g.add_argument("--model", required=True)
    g.add_argument("--data", required=True, help="a world directory")
    g.add_argument("--prompt", default="blind-painter", help="blind-painter: the long description prompt")
    g.add_argument("--max-new-tokens", type=int, help="default: enough for the world's largest scene")
    g.add_argument("--limit", type=int, default=32, help="number of scenes (default 32)")
    g.add_argument("--batch-size", type=int, default=32)
    g.add_argument("--out", required=True, help="directory for diagnosis.json and the plots")
    placement_args(g)
    g.set_defaults(func=cmd_diagnose)

    pv = sub.add_parser("pvm", help="Persistent Visual Memory").add_subparsers(dest="pvm_command", required=True)
    pt = pv.add_parser("train", help="stage 1 (sft, backbone frozen) or stage 2 (grpo) of a PVM adapter")
    pt.add_argument("--stage", default="sft", choices=["sft", "grpo"])
    pt.add_argument("--model", required=True, help="base model directory")
    pt.add_argument("--data", required=True, help="a world directory")
    pt.add_argument("--out", required=True, help="adapter directory (pvm_config.json + pvm.safetensors)")
    pt.add_argument("--init", help="grpo: the stage-1 adapter to start from (also the KL reference)")
    pt.add_argument("--layers", type=int, nargs="+", help="sft: decoder layers (default: strided)")
    pt.add_argument("--latent-dim", type=int, help="sft: d' (default: hidden / 4)")
    pt.add_argument("--heads", type=int, default=1, help="sft")
    pt.add_argument("--gate", default="scalar", choices=["scalar", "channel"], help="sft")
    pt.add_argument("--steps", type=int, help="default: 600 (sft), 100 (grpo)")
    pt.add_argument("--lr", type=float, help="projections; default: 1e-3 (sft), 2e-4 (grpo)")
    pt.add_argument("--gate-lr", type=float, help="the gate; default: 1e-2 (sft), 2e-3 (grpo)")
    pt.add_argument("--batch-size", type=int, default=16, help="sft")
    pt.add_argument("--beta", type=float, default=0.04, help="grpo: KL coefficient (0 = no reference model)")
    pt.add_argument("--num-generations", type=int, default=4, help="grpo: completions per prompt")
    pt.add_argument("--prompts-per-step", type=int, default=4, help="grpo")
    pt.add_argument("--max-completion-length", type=int, help="grpo (default: the world's description budget)")
    pt.add_argument("--tasks", nargs="+", default=["describe", "open"],
                    help="grpo prompts: describe open yes_no cell")
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--stop-after", type=int, help="stop after this many steps (resume later)")
    grad_accum_arg(pt)
    pt.set_defaults(func=cmd_pvm_train)

    lo = sub.add_parser("lora", help="the parameter-matched LoRA control for PVM").add_subparsers(
        dest="lora_command", required=True)
    lt = lo.add_parser("train", help="train a LoRA with PVM's layers and (nearest) parameter count")
    lt.add_argument("--model", required=True, help="base model directory")
    lt.add_argument("--data", required=True, help="a world directory")
    lt.add_argument("--out", required=True, help="adapter directory (PEFT format)")
    lt.add_argument("--layers", type=int, nargs="+", help="the PVM layers to match (default: strided)")
    lt.add_argument("--latent-dim", type=int, help="the PVM d' to match (default: hidden / 4)")
    lt.add_argument("--steps", type=int, default=600)
    lt.add_argument("--lr", type=float, default=1e-3)
    lt.add_argument("--batch-size", type=int, default=16)
    lt.add_argument("--seed", type=int, default=0)
    lt.add_argument("--stop-after", type=int, help="stop after this many steps (resume later)")
    grad_accum_arg(lt)
    lt.set_defaults(func=cmd_lora_train)

    br = sub.add_parser("bridge", help="LIA-MTR and baseline bridges").add_subparsers(dest="bridge_command",
                                                                                      required=True)
    btr = br.add_parser("train", help="phase 1 (alignment, bridge only) or phase 2 (instruction tuning)")
    btr.add_argument("--phase", type=int, required=True, choices=[1, 2])
    btr.add_argument("--model", required=True, help="phase 1: a LLaVA-family model directory, or a world base "
                     "directory (backbone from its lm/vision stages); phase 2: a phase-1 output")
    btr.add_argument("--data", required=True, help="a world directory")
    btr.add_argument("--out", required=True)
    btr.add_argument("--bridge", default="lia_mtr", help="phase 1: lia_mtr | mlp | attention | attention_sdpa | "
                     "linear_attention")
    btr.add_argument("--steps", type=int, help="default: 200 (phase 1), 4000 (phase 2)")
    btr.add_argument("--lr", type=float, help="default: 2e-3")
    btr.add_argument("--batch-size", type=int, default=16)
    btr.add_argument("--seed", type=int, default=2)
    btr.add_argument("--stop-after", type=int, help="stop after this many steps (resume later)")
    grad_accum_arg(btr)
    btr.set_defaults(func=cmd_bridge_train)

    df = sub.add_parser("diffusion", help="masked-diffusion VLMs").add_subparsers(dest="diffusion_command",
                                                                                  required=True)
    dtr = df.add_parser("train", help="train a tiny LLaDA-V-style VLM on the world (masked-diffusion objective)")
    dtr.add_argument("--base", required=True, help="a world base directory (its vision stage gives the tower)")
    dtr.add_argument("--data", required=True, help="a world directory")
    dtr.add_argument("--out", required=True)
    dtr.add_argument("--steps", type=int, default=2500)
    dtr.add_argument("--lr", type=float, default=2e-3)
    dtr.add_argument("--batch-size", type=int, default=16)
    dtr.add_argument("--answer-length", type=int, default=64, help="generation window (answers cut / eos-filled)")
    dtr.add_argument("--seed", type=int, default=0)
    dtr.add_argument("--stop-after", type=int, help="stop after this many steps (resume later)")
    grad_accum_arg(dtr)
    dtr.set_defaults(func=cmd_diffusion_train)

    bn = sub.add_parser("bench", help="benchmarks (printed table + JSON)")
    bn.add_argument("name", choices=["probe-overhead", "pvm-decode", "bridge-memory", "needle", "scan", "diffusion"])
    bn.add_argument("--out", default="runs/bench")
    bn.add_argument("--batch", type=int, default=8)
    bn.add_argument("--new-tokens", type=int, default=128)
    bn.add_argument("--repeats", type=int, default=3)
    bn.add_argument("--mem-limit-gib", type=float, default=16.0, help="bridge-memory: skip configurations "
                    "predicted to need more")
    bn.set_defaults(func=cmd_bench)

    from .commands.eval_chair import add_parser as add_eval_parser

    add_eval_parser(sub)

    d = sub.add_parser("demo", help="build the world, train the base, evaluate, write runs/<name>/report.html")
    d.add_argument("--smoke", action="store_true", help="a ~1 minute run with tiny budgets")
    d.add_argument("--profile", default="full", help="full | smoke")
    d.add_argument("--runs", default="runs", help="where runs and the model cache live")
    d.add_argument("--name", help="run name (default: the profile)")
    d.add_argument("--retrain", action="store_true", help="ignore the model cache")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "precision", None) is not None:  # a training command
            from .world.distributed import is_main_process, launch_options

            if not is_main_process():  # under `accelerate launch`, one process prints the summaries
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            with launch_options(args.precision, args.device):
                return args.func(args)
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        print(f"keepsight: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
