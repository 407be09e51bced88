"""keepsight inside lmms-eval 0.7's own evaluator, on a local yes/no task with world images.

Needs lmms-eval (and so torchvision): ``make test-lmms`` builds ``.venv-lmms`` and runs this directory.
``make test`` does not collect it (``--ignore=tests/lmms`` in pyproject), and without lmms-eval it fails
at import rather than skipping."""

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
import torch

try:
    import lmms_eval  # noqa: F401
except ImportError as e:  # never a silent skip: this directory exists to run lmms-eval
    raise ImportError("tests/lmms needs lmms-eval; run `make test-lmms` (it builds .venv-lmms)") from e

from keepsight.integrations.lmms_eval import KeepsightLMM

pytestmark = pytest.mark.lmms

GEN_TASK, MC_TASK = "keepsight_yesno_gen", "keepsight_yesno_mc"
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}

UTILS = '''
def doc_to_visual(doc):
    return [doc["image"].convert("RGB")]
'''

GEN_YAML = """
task: {task}
dataset_path: {data}
dataset_kwargs:
  load_from_disk: true
test_split: test
output_type: generate_until
doc_to_visual: !function utils.doc_to_visual
doc_to_text: "{{{{question}}}}"
doc_to_target: answer
generation_kwargs:
  max_new_tokens: 3
  temperature: 0
  do_sample: false
  until: ["."]
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
metadata:
  - version: 0.0
"""

MC_YAML = """
task: {task}
dataset_path: {data}
dataset_kwargs:
  load_from_disk: true
test_split: test
output_type: multiple_choice
doc_to_visual: !function utils.doc_to_visual
doc_to_text: "{{{{question}}}}"
doc_to_choice: ["yes", "no"]
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  - version: 0.0
"""


@dataclass
class Req:
    args: tuple


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """Tiny LLaVA + processor, a PVM adapter (gates 0.5), a tiny LLaDA-V, and a task directory whose two
    tasks read a saved DatasetDict of world images and yes/no questions."""
    import datasets

    from keepsight.pvm import PVMConfig, attach_pvm, save_pvm
    from keepsight.world import generate_scenes, render, world_config, yes_no_questions
    from keepsight.world.models import build_llada_v, build_model
    from keepsight.world.processor import build_processor

    root = tmp_path_factory.mktemp("lmms")
    processor = build_processor()
    base = root / "base"
    model = build_model("tiny-llava", processor.tokenizer)
    model.save_pretrained(base)
    processor.save_pretrained(base)
    attach_pvm(model, PVMConfig(layers=[1, 3], pvm_hidden_size=32))
    for branch in model.pvm.values():
        branch.gate.data.fill_(0.5)
    pvm = save_pvm(model, root / "pvm")
    llada = root / "llada"
    build_llada_v(processor).save_pretrained(llada)
    processor.save_pretrained(llada)

    cfg = world_config()
    rows = {"image": [], "question": [], "answer": []}
    for scene in generate_scenes(cfg, 3, seed=1):
        image = render(scene, cfg.noise_std)
        for q in yes_no_questions(scene, cfg)[:2]:
            rows["image"].append(image)
            rows["question"].append(q["question"])
            rows["answer"].append(q["answer"])
    features = datasets.Features({"image": datasets.Image(), "question": datasets.Value("string"),
                                  "answer": datasets.Value("string")})
    data = root / "data"
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(rows, features=features)}).save_to_disk(str(data))
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "utils.py").write_text(textwrap.dedent(UTILS))
    (tasks / f"{GEN_TASK}.yaml").write_text(GEN_YAML.format(task=GEN_TASK, data=data))
    (tasks / f"{MC_TASK}.yaml").write_text(MC_YAML.format(task=MC_TASK, data=data))
    return {"base": base, "pvm": pvm, "llada": llada, "tasks": tasks, "rows": rows, "root": root}


def expected(assets, batch_size=1, **model_args):
    """Per document, from KeepsightLMM called directly (no lmms-eval): the generated answer, whether it is
    exactly right, the log-probabilities of " yes" and " no", and whether the likelier one is right."""
    rows = assets["rows"]
    lm = KeepsightLMM(pretrained=assets["base"], device="cpu", batch_size=batch_size, **model_args)
    assert lm.ll_output == "logprob"
    lm.task_dict = {"t": {"test": [{"image": im} for im in rows["image"]]}}
    n = len(rows["question"])
    gen_kwargs = {"max_new_tokens": 3, "temperature": 0, "do_sample": False, "until": ["."]}
    texts = lm.generate_until([Req((rows["question"][i], gen_kwargs, lambda d: [d["image"]], i, "t", "test"))
                               for i in range(n)])
    lls = [[lm.loglikelihood([Req((rows["question"][i], " " + c, lambda d: [d["image"]], i, "t", "test"))])[0][0]
            for c in ("yes", "no")] for i in range(n)]
    return {"texts": texts, "exact": [float(t.lower() == a) for t, a in zip(texts, rows["answer"])], "lls": lls,
            "acc": [float(("yes", "no")[int(torch.tensor(ll).argmax())] == a) for ll, a in zip(lls, rows["answer"])]}


def check_samples(gen_samples, mc_samples, want):
    """lmms-eval's logged samples against ``expected``: same answers, the negated log-probabilities, and
    per-document scores (a wrong sign would flip acc on every document where the model prefers the wrong
    choice)."""
    gen = sorted(gen_samples, key=lambda s: s["doc_id"])
    mc = sorted(mc_samples, key=lambda s: s["doc_id"])
    texts = [s["filtered_resps"] for s in gen]  # in memory a one-item list, in the jsonl the string
    assert [t[0] if isinstance(t, list) else t for t in texts] == want["texts"]
    assert [s["exact_match"] for s in gen] == want["exact"]
    got = [float(pair[0]) for s in mc for pair in s["filtered_resps"]]  # (nll, greedy) per choice
    assert got == pytest.approx([-a for ll in want["lls"] for a in ll], abs=1e-4)
    assert [s["acc"] for s in mc] == want["acc"]


def test_the_entry_point_registers_keepsight():
    from lmms_eval import models
    from lmms_eval.api.model import lmms

    eps = importlib.metadata.entry_points(group="lmms_eval.models")
    assert "keepsight" in [ep.name for ep in eps], "reinstall keepsight (pip install -e .) to write its entry point"
    cls = models.get_model("keepsight")
    assert cls.__name__ == "KeepsightLMMEval" and issubclass(cls, lmms) and issubclass(cls, KeepsightLMM)
    assert cls.is_simple and cls.LL_OUTPUT == "nll"
    assert "keepsight" in models.AVAILABLE_MODELS


def test_lmms_eval_cli_scores_keepsight_on_a_local_task(assets):
    out = assets["root"] / "cli-out"
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "keepsight", "--model_args",
           f"pretrained={assets['base']},dtype=float32", "--tasks", f"{GEN_TASK},{MC_TASK}",
           "--include_path", str(assets["tasks"]), "--batch_size", "2", "--device", "cpu",
           "--output_path", str(out), "--log_samples"]
    run = subprocess.run(cmd, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    found = sorted(out.rglob("*results*.json"))
    assert found, f"no results file under {out}: {sorted(p.name for p in out.rglob('*'))}"
    results = json.loads(found[-1].read_text())["results"]
    want = expected(assets, batch_size=2)
    assert results[GEN_TASK]["exact_match,none"] == pytest.approx(sum(want["exact"]) / len(want["exact"]))
    assert results[MC_TASK]["acc,none"] == pytest.approx(sum(want["acc"]) / len(want["acc"]))
    samples = {task: [json.loads(line) for f in out.rglob(f"*samples_{task}.jsonl")
                      for line in f.read_text().splitlines() if line.strip()] for task in (GEN_TASK, MC_TASK)}
    check_samples(samples[GEN_TASK], samples[MC_TASK], want)


def test_simple_evaluate_with_pvm_and_with_diffusion(assets):
    from lmms_eval.evaluator import simple_evaluate
    from lmms_eval.tasks import TaskManager

    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    tm = TaskManager(include_path=str(assets["tasks"]))
    res = simple_evaluate(model="keepsight", model_args=f"pretrained={assets['base']},method=pvm,pvm={assets['pvm']}",
                          tasks=[GEN_TASK, MC_TASK], task_manager=tm, device="cpu", batch_size=1, log_samples=True)
    want = expected(assets, method="pvm", pvm=assets["pvm"])
    assert want["lls"] != expected(assets)["lls"]  # the adapter changes the model
    assert res["results"][MC_TASK]["acc,none"] == pytest.approx(sum(want["acc"]) / len(want["acc"]))
    check_samples(res["samples"][GEN_TASK], res["samples"][MC_TASK], want)

    res = simple_evaluate(model="keepsight", tasks=[GEN_TASK], task_manager=tm, device="cpu", batch_size=2,
                          model_args=f"pretrained={assets['llada']},method=diffusion,steps=4,gen_length=4,"
                                     "mps=true,mrs_beta=0.01", log_samples=True)
    score = res["results"][GEN_TASK]["exact_match,none"]
    assert 0.0 <= score <= 1.0
    samples = res["samples"][GEN_TASK]
    assert len(samples) == len(assets["rows"]["question"])
    assert all(isinstance(s["filtered_resps"][0], str) for s in samples)
    plain = simple_evaluate(model="keepsight", tasks=[GEN_TASK], task_manager=tm, device="cpu", batch_size=2,
                            model_args=f"pretrained={assets['llada']},method=diffusion,steps=4,gen_length=4",
                            log_samples=True)["samples"][GEN_TASK]
    assert [s["filtered_resps"] for s in plain] != [s["filtered_resps"] for s in samples]  # MPS + MRS act


def test_the_module_entry_point_wraps_the_cli():
    run = subprocess.run([sys.executable, "-m", "keepsight.integrations.lmms_eval", "models"],
                         env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "keepsight" in run.stdout
