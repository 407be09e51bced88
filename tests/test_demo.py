import dataclasses
import json
import math

import pytest

from keepsight.demo import cache_key, run_demo
from keepsight.openmp import wait_policy
from keepsight.profiles import PROFILE_HELP, PROFILES
from smoke_pins import PINS, pick


def test_demo_smoke_writes_results_and_reuses_the_cached_model(tmp_path, capsys, monkeypatch):
    res = run_demo("smoke", runs_dir=tmp_path)
    out = tmp_path / "smoke"
    assert (out / "base").is_symlink() and (out / "base" / "config.json").is_file()  # --model runs/<name>/base
    assert (out / "base").resolve() == (tmp_path / "cache").resolve() / (out / "base").resolve().name
    saved = json.loads((out / "results.json").read_text())
    assert saved["profile"] == "smoke"
    base = saved["base"]
    assert set(base["yes_no"]["categories"]) == {"existence", "count", "colour", "shape", "position", "scene"}
    assert len(base["dilution"]["by_index"]) == saved["world"]["max_objects"]
    assert {"chair_i", "chair_s", "recall", "hallucination_rate"} <= set(base["descriptions"]["chair"])
    html = (out / "report.html").read_text()
    assert "Dilution: accuracy by object index" in html and "data:image/png;base64" in html
    assert (out / "dilution.png").stat().st_size > 1000
    diag = base["diagnosis"]
    assert len(diag["omega_v_by_layer"]) == 4 and diag["steps"] >= 1
    assert "Dilution diagnostics" in html and (out / "diagnosis" / "omega_v_loglog.png").is_file()
    assert res["base"]["yes_no"] == base["yes_no"]
    # the pipeline's numbers, pinned: a silent change to data, training or evaluation shows here
    pinned = json.loads(PINS.read_text())
    got = pick(saved)
    moved = {k: (pinned[k], got[k]) for k in pinned if not math.isclose(got[k], pinned[k], rel_tol=1e-2, abs_tol=1e-3)}
    assert not moved, f"smoke results moved (pinned, now); regenerate with tests/smoke_pins.py if intended: {moved}"
    # the PVM arms: same evaluation for each, adapters trained and cached, gates reported
    pvm = saved["pvm"]
    assert list(pvm["arms"]) == ["base", "pvm_sft", "lora", "pvm_grpo", "full_ft"]
    assert pvm["comparison"]["base"]["late_rel_change"] in (0.0, None)
    assert set(pvm["training"]["pvm_sft"]["after"]) == set(pvm["training"]["pvm_grpo"]["after"])
    assert pvm["training"]["lora"]["lora_parameters"] > 0 and "PVM: the arms" in html
    # every arm is also scored after its own description, with the oracle beside it, and plotted
    for arm in pvm["arms"].values():
        ad = arm["after_description"]
        assert {"none", "description", "oracle", "drop", "recovery"} <= set(ad) and ad["description"]["n"] > 0
    assert (out / "pvm_text_regimes.png").is_file() and "accuracy as text grows, per arm" in html
    md = (out / "results.md").read_text()
    assert "| its own description (" in md
    assert f"OpenMP threads wait: {wait_policy()};" in md  # how the run's threads waited (slow under a wrong one)
    # and the length of each arm's own description stands beside it (less text is not more access to the image)
    words = pvm["comparison"]["pvm_sft"]["description_words"]
    assert words == pvm["arms"]["pvm_sft"]["after_description"]["description_words"] > 0
    assert f"| words of its own description (the text before that question) | {pvm['comparison']['base']['description_words']:.1f} |" in md
    # the bridge arms: MLP and LIA-MTR after each phase, the write gate probed
    bridge = saved["bridge"]
    assert list(bridge["arms"]) == ["mlp_phase1", "lia_mtr_phase1", "mlp_phase2", "lia_mtr_phase2"]
    assert 0 < bridge["write_gate"]["lia_mtr_phase2"]["gate_mean"] < 1
    assert "Bridge: MLP vs LIA-MTR" in html
    diff = saved["diffusion"]
    assert {(r["steps"], r["method"]) for r in diff["grid"]} == {(4, m) for m in ("none", "mps", "mrs", "both", "ntk",
                                                                                   "yarn")}
    assert len(diff["prior_cosine"]["none"]) == 4 and "Diffusion: methods x steps" in html
    # PVM's mechanism control: the arms scored with the image withheld, each with its interval, and a verdict
    control = saved["control"]
    assert list(control["arms"]) == ["base_with_image", "base", "pvm_sft", "pvm_sft_no_output_norm", "lora"]
    assert control["ordinary"]["base_with_image"]["all"]["acc"] == base["yes_no"]["overall_acc"]
    assert list(control["ordinary"]) == list(control["arms"])  # the ordinary set beside the prior-balanced one
    n_balanced, n_ordinary = control["arms"]["base"]["all"]["n"], control["ordinary"]["base"]["all"]["n"]
    assert n_ordinary < n_balanced <= 2 * n_ordinary  # each question with its twin (some have none among 16 scenes)
    assert all(v["low"] <= v["acc"] <= v["high"] for arm in control["arms"].values() for v in arm.values())
    assert set(control["verdict"]) == {"pvm_sft", "pvm_sft_no_output_norm", "lora"} and "PVM mechanism control" in html
    # the ablation arm: its own adapter, the block without its output norm
    ablated = json.loads((tmp_path / control["adapters"]["pvm_sft_no_output_norm"] / "pvm_config.json").read_text())
    assert ablated["pvm"]["output_norm"] is False and control["adapters"]["pvm_sft"] != control["adapters"]["pvm_sft_no_output_norm"]
    assert list(control["open"]) == list(control["arms"])  # the open-answer lens, the same arms
    assert {k: v["acc"] for k, v in control["open"]["base_with_image"].items()} == base["open"]
    # second run (base only): the model is reused from the cache (keyed by config + data), only evaluation runs
    monkeypatch.setitem(PROFILES, "smoke-base", dataclasses.replace(PROFILES["smoke"], name="smoke-base", pvm=None,
                                                                     bridge=None, diffusion=None, control=None))
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    again = run_demo("smoke-base", runs_dir=tmp_path)
    assert "reusing cached base model" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == cached  # nothing trained anew
    assert again["base"]["yes_no"] == base["yes_no"]  # same model, same data: same numbers
    assert "pvm" not in again


def test_every_profile_is_described_once_in_the_help(capsys):
    """``keepsight demo --help`` lists each profile from PROFILE_HELP: one text per profile, none for a profile that
    does not exist."""
    from keepsight.cli import main

    assert list(PROFILE_HELP) and set(PROFILE_HELP) == set(PROFILES)
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    shown = "".join(capsys.readouterr().out.split())  # argparse wraps lines (at spaces and hyphens)
    for name, text in PROFILE_HELP.items():
        assert "".join(f"{name}: {text}".split()) in shown


def test_cache_key_changes_with_config():
    p = PROFILES["smoke"]
    assert cache_key(p) == cache_key(dataclasses.replace(p))
    assert cache_key(p) != cache_key(dataclasses.replace(p, n_train=p.n_train + 1))
