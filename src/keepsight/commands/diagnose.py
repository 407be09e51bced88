"""``keepsight diagnose``: visual attention mass, TVR and LogitLens while a model describes world scenes."""

from __future__ import annotations

from ..atomic import check_output_dir, mark, write_json
from ..models import load_checkpoint
from ..report.plots import plot_diagnosis
from ..world.diagnose import diagnose
from .options import placement_args, positive_int, read_samples


def add_parser(sub) -> None:
    g = sub.add_parser("diagnose", help="visual attention mass, TVR and LogitLens while generating")
    g.add_argument("--model", required=True)
    g.add_argument("--data", required=True, help="a world directory")
    g.add_argument("--prompt", default="blind-painter", help="blind-painter: the long description prompt")
    g.add_argument("--max-new-tokens", type=positive_int, help="default: enough for the world's largest scene")
    g.add_argument("--limit", type=positive_int, default=32, help="number of scenes (default 32)")
    g.add_argument("--batch-size", type=positive_int, default=32)
    g.add_argument("--out", required=True, help="directory for diagnosis.json and the plots")
    placement_args(g)
    g.set_defaults(func=run)


KIND = "diagnosis"


def run(args) -> int:
    out = check_output_dir(args.out, "--out", kinds=(KIND,), inputs=[args.model, args.data])
    samples = read_samples(args.data, args.limit)
    model, processor = load_checkpoint(args.model, dtype=args.dtype, device=args.device, expect="autoregressive")
    diag = diagnose(model, processor, samples, args.prompt, args.max_new_tokens, args.batch_size)
    out.mkdir(parents=True, exist_ok=True)
    mark(out, KIND)
    write_json(out / "diagnosis.json", diag)
    plot_diagnosis(diag, out)
    slope = "n/a" if diag["slope"] is None else f"{diag['slope']:.3f}"
    print(f"Omega_V slope (log-log, generated steps) {slope}; TVR plateau {diag['tvr_plateau']:.2f}; "
          f"mean LogitLens convergence layer {diag['convergence_layer_mean']:.2f}; wrote {out}")
    return 0
