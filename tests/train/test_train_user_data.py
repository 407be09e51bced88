"""Every training command on a user's data: 2 steps from a LLaVA-format fixture on a tiny saved checkpoint of each
architecture the command applies to, through the CLI; each writes its output and resumes a stopped run."""

import json

import pytest

from keepsight.cli import main
from keepsight.data import export_llava
from keepsight.world import generate_scenes, world_config
from keepsight.world.tasks import VLMDataset, WorldSamples
from tiny_checkpoints import save_tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

AUTOREGRESSIVE = ["tiny-llava", "tiny-qwen3vl", "tiny-qwen25vl"]


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    """A LLaVA-format JSON (captions, yes/no, multi-turn chats) with its images, and the tiny checkpoints."""
    root = tmp_path_factory.mktemp("userdata")
    cfg = world_config()
    samples = WorldSamples.from_scenes(cfg, generate_scenes(cfg, 4, seed=9))
    data = export_llava(VLMDataset(samples, ("caption", "yes_no", "chat"), 0, yes_no_categories=1, max_turns=3),
                        root / "train.json", root / "images")
    yes_no = export_llava(VLMDataset(samples, ("yes_no",), 0, yes_no_categories=1), root / "yesno.json",
                          root / "images-yn")
    models = {name: save_tiny_checkpoint(name, root / name) for name in [*AUTOREGRESSIVE, "tiny-llada-v"]}
    return {"root": root, "data": data, "yes_no": yes_no, "models": models}


def _run_and_resume(argv, out):
    """The command with --stop-after 1 (a checkpoint, no output), then again (resumes to the end)."""
    assert main([*argv, "--stop-after", "1"]) == 0
    assert (out / "checkpoints" / "checkpoint-1").is_dir() and not (out / "checkpoints" / "checkpoint-2").exists()
    assert main(argv) == 0
    assert not (out / "checkpoints").exists()  # the finished output holds only its files


def _summary(out, name):
    return json.loads((out / name).read_text())


@pytest.mark.parametrize("arch", AUTOREGRESSIVE)
def test_pvm_sft_and_lora_on_llava_format_data(fixture, arch, tmp_path, capsys):
    model, data = fixture["models"][arch], fixture["data"]
    common = ["--model", str(model), "--data", str(data), "--steps", "2", "--batch-size", "2", "--layers", "1"]
    out = tmp_path / "pvm"
    _run_and_resume(["pvm", "train", "--stage", "sft", *common, "--out", str(out)], out)
    assert {p.name for p in out.iterdir()} >= {"pvm_config.json", "pvm.safetensors"}
    assert "pre-flight of" in capsys.readouterr().out
    lora = tmp_path / "lora"
    _run_and_resume(["lora", "train", *common, "--out", str(lora)], lora)
    assert (lora / "adapter_model.safetensors").is_file()


def test_pvm_grpo_on_data_with_reference_answers(fixture, tmp_path):
    model = fixture["models"]["tiny-llava"]
    sft = tmp_path / "sft"
    assert main(["pvm", "train", "--model", str(model), "--data", str(fixture["data"]), "--out", str(sft),
                 "--steps", "1", "--batch-size", "2", "--layers", "1"]) == 0
    out = tmp_path / "grpo"
    argv = ["pvm", "train", "--stage", "grpo", "--model", str(model), "--init", str(sft), "--data",
            str(fixture["yes_no"]), "--out", str(out), "--steps", "2", "--num-generations", "2",
            "--prompts-per-step", "2", "--max-completion-length", "3", "--reward", "yesno", "exact"]
    _run_and_resume(argv, out)
    summary = _summary(out, "pvm_grpo.json")
    assert summary["init"] == str(sft) and (out / "pvm.safetensors").is_file()


def test_bridge_both_phases_on_llava_format_data(fixture, tmp_path):
    model, data = fixture["models"]["tiny-llava"], fixture["data"]
    p1 = tmp_path / "p1"
    _run_and_resume(["bridge", "train", "--phase", "1", "--model", str(model), "--data", str(data), "--out", str(p1),
                     "--steps", "2", "--batch-size", "2"], p1)
    p2 = tmp_path / "p2"
    _run_and_resume(["bridge", "train", "--phase", "2", "--model", str(p1), "--data", str(data), "--out", str(p2),
                     "--steps", "2", "--batch-size", "2", "--lm-lr", "1e-4"], p2)
    assert json.loads((p2 / "config.json").read_text())["model_type"] == "keepsight_llava"


def test_diffusion_finetunes_a_llada_v_checkpoint_on_llava_format_data(fixture, tmp_path):
    out = tmp_path / "dv"
    _run_and_resume(["diffusion", "train", "--model", str(fixture["models"]["tiny-llada-v"]), "--data",
                     str(fixture["data"]), "--out", str(out), "--steps", "2", "--batch-size", "2",
                     "--answer-length", "8"], out)
    assert (out / "config.json").is_file() and _summary(out, "diffusion_train.json")["base"]


def test_bad_rows_stop_training_before_any_work(fixture, tmp_path, capsys):
    rows = json.loads(fixture["data"].read_text())
    rows[2]["image"] = "images/missing.png"
    bad = fixture["root"] / "bad.json"
    bad.write_text(json.dumps(rows))
    out = tmp_path / "pvm"
    argv = ["pvm", "train", "--model", str(fixture["models"]["tiny-llava"]), "--data", str(bad), "--out", str(out),
            "--steps", "1", "--batch-size", "2", "--layers", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{bad} row 2" in err and "missing.png is missing" in err and "--skip-bad-rows" in err
    assert not out.exists()
    assert main([*argv, "--skip-bad-rows"]) == 0
    assert "1 bad rows (1 skipped)" in capsys.readouterr().out


def test_eval_generate_and_score(fixture, tmp_path, capsys):
    pred = tmp_path / "pred.jsonl"
    assert main(["eval", "generate", "--model", str(fixture["models"]["tiny-llava"]), "--data",
                 str(fixture["yes_no"]), "--out", str(pred), "--max-new-tokens", "2", "--batch-size", "3"]) == 0
    records = [json.loads(line) for line in pred.read_text().splitlines()]
    rows = json.loads(fixture["yes_no"].read_text())
    assert [r["id"] for r in records] == [r["id"] for r in rows]
    assert [r["reference"] for r in records] == [r["conversations"][-1]["value"] for r in rows]
    assert main(["eval", "score", "--pred", str(pred), "--kind", "yesno"]) == 0
    score = json.loads(pred.with_suffix(".score.json").read_text())
    assert score["overall"]["n"] == len(rows) and 0 <= score["overall"]["accuracy"] <= 1
    assert "yes-ratio" in capsys.readouterr().out
