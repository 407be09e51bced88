"""A setting that cannot take effect is refused by name: an option given twice, an empty MemVR window, PAI ids outside
the vocabulary, a cache refresh without a cache, a benchmark length it would cut, duplicate settings or prediction ids,
and the Python API's argument types (a string where a list of prompts goes, a method given twice, a registration that
would never be built)."""

import dataclasses
import json

import pytest

from keepsight.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("extra, named", [
    (["--vcd.alpha", "0.5", "--vcd.alpha", "1"], "--vcd.alpha given twice"),
    (["--pai.amplify_prefill", "--no-pai.amplify_prefill"], "--no-pai.amplify_prefill given twice"),
    (["--limit", "2", "--limit", "3"], "--limit given twice"),
])
def test_an_option_given_twice_is_refused(extra, named, capsys):
    with pytest.raises(SystemExit) as e:
        main(["world", "eval", "--model", "m", "--data", "d", *extra])
    assert e.value.code == 2 and named in _error(capsys)
    with pytest.raises(SystemExit) as e:  # a diffusion method's setting, on a command that takes it
        main(["eval", "generate", "--model", "m", "--data", "d", "--out", "o.jsonl", "--diffusion", "--mps.k", "0",
              "--mps.k", "3"])
    assert e.value.code == 2 and "--mps.k given twice" in _error(capsys)


def test_repeatable_options_still_repeat(tmp_path, capsys):
    # --questions extends: two files are two files, not an error (the run then stops on the missing files)
    assert main(["eval", "pope", "--questions", str(tmp_path / "a.json"), "--questions", str(tmp_path / "b.json"),
                 "--answers", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "given twice" not in capsys.readouterr().err


def test_settings_that_would_do_nothing_are_refused():
    from keepsight.baselines.memvr import MemVRConfig
    from keepsight.diffusion.sampler import SamplerConfig

    with pytest.raises(ValueError, match="leave no layer to probe"):
        MemVRConfig(start_layer=3, end_layer=1)
    with pytest.raises(ValueError, match="leave no layer to probe"):
        MemVRConfig(start_layer=3, end_layer=4)
    MemVRConfig(start_layer=3, end_layer=5)  # layer 4
    with pytest.raises(ValueError, match="refresh_every refreshes the cache"):
        SamplerConfig(gen_length=8, steps=8, refresh_every=2)
    SamplerConfig(gen_length=8, steps=8, refresh_every=2, cache="prefix")


def test_pai_ids_outside_the_vocabulary_and_an_empty_memvr_window_on_the_model(tmp_path):
    from keepsight.baselines.memvr import MemVR, MemVRConfig
    from keepsight.baselines.pai import PAI, PAIConfig
    from tiny_checkpoints import load_vlm, save_tiny_checkpoint

    model, _ = load_vlm(save_tiny_checkpoint("tiny-llava", tmp_path / "m"))
    vocab = model.get_input_embeddings().num_embeddings
    with pytest.raises(ValueError, match=rf"drop_token_ids \[{vocab + 5}\] are outside the model's vocabulary"):
        with PAI(PAIConfig(drop_token_ids=[1, vocab + 5])).apply(model):
            pass
    with pytest.raises(ValueError, match="leave no layer to probe"):  # depth 4: (2, 4) leaves 3, the last layer
        with MemVR(MemVRConfig(start_layer=2, end_layer=4)).apply(model):
            pass


@pytest.mark.parametrize("name, n, limit", [("pvm-decode", 100, 16), ("baselines", 1000, 64)])
def test_a_benchmark_refuses_a_length_it_would_cut(name, n, limit, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["bench", name, "--new-tokens", str(n), "--out", str(out)]) == 2
    assert f"--new-tokens {n}: bench {name} measures at most {limit} new tokens" in _error(capsys)
    assert not out.exists()


def test_duplicates_in_settings_and_predictions_are_refused(tmp_path, capsys):
    from keepsight.commands.options import json_settings

    with pytest.raises(ValueError, match=r"--baseline-args: settings \['alpha'\] given twice"):
        json_settings("--baseline-args", '{"alpha": 1, "beta": 0.1, "alpha": 2}')
    pred = tmp_path / "p.jsonl"
    rows = [{"id": "a", "answer": "yes", "reference": "yes"}, {"id": "a", "answer": "no", "reference": "yes"}]
    pred.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "score", "--pred", str(pred), "--out", str(tmp_path / "s.json")]) == 2
    assert "ids ['a'] appear more than once with the same prompt" in _error(capsys)
    assert not (tmp_path / "s.json").exists()
    rows = [{"id": "a", "prompt": "dog?", "answer": "yes", "reference": "yes"},  # two questions about one image
            {"id": "a", "prompt": "cat?", "answer": "no", "reference": "yes"}]
    pred.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "score", "--pred", str(pred), "--out", str(tmp_path / "s.json")]) == 0


def test_a_list_valued_category_is_refused(tmp_path):
    from keepsight.data import open_dataset

    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"id": "x", "category": ["a", "b"], "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "yes"}]}]))
    with pytest.raises(ValueError, match="'category' must be one name"):
        open_dataset(data).category(0)


def test_the_python_api_checks_its_arguments():
    from keepsight.inference import Decoders
    from keepsight.inference.arguments import decoding_settings
    from keepsight.inference.registry import METHODS, register_method

    with pytest.raises(TypeError, match=r"Decoders\(\[\('vcd', None\)\]\)"):
        Decoders("vcd")
    with pytest.raises(ValueError, match="'vcd' given twice"):
        Decoders([("vcd", None), ("vcd", {"alpha": 2.0})])
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoding_settings({"max_new_tokens": 0}, 128)
    assert decoding_settings({}, 128)["max_new_tokens"] == 128

    @dataclasses.dataclass
    class Cfg:
        factor: float = 1.0

    before = dict(METHODS)
    with pytest.raises(ValueError, match="needs a config dataclass \\(the class\\)"):
        register_method("damp_a", Cfg(), lambda c: c)
    with pytest.raises(ValueError, match="build must be callable"):
        register_method("damp_b", Cfg, 42)
    with pytest.raises(ValueError, match="stage 'load' is for keepsight's model-side methods"):
        register_method("damp_c", Cfg, lambda c: c, stage="load")
    with pytest.raises(ValueError, match="cannot be replaced"):
        register_method("none", stage="load", replace=True)
    assert METHODS == before


def test_pipeline_generate_checks_its_prompts_and_settings(tmp_path):
    from keepsight.inference import Pipeline
    from tiny_checkpoints import save_tiny_checkpoint

    pipe = Pipeline(save_tiny_checkpoint("tiny-llava", tmp_path / "m"), dtype="float32", device="cpu")
    with pytest.raises(TypeError, match="wrap it in a list"):
        pipe.generate("describe the image.")
    with pytest.raises(TypeError, match=r"unknown decoding settings \['max_tokens'\]"):
        pipe.generate(["describe the image."], max_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        pipe.generate(["describe the image."], max_new_tokens=0)
    assert len(pipe.generate(["describe the image."], max_new_tokens=2).texts) == 1


def test_a_json_list_with_a_byte_order_mark_reads_as_editors_write_it(tmp_path):
    from keepsight.data import open_dataset

    rows = [{"id": "x", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yes"}]}]
    data = tmp_path / "bom.json"
    data.write_bytes(b"\xef\xbb\xbf" + json.dumps(rows).encode())
    assert open_dataset(data)[0].messages[1]["content"][0]["text"] == "yes"


def test_a_garbled_against_file_is_named_before_the_run(tmp_path, capsys):
    garbled = tmp_path / "results.md"
    garbled.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert main(["demo", "--reproduce", "--against", str(garbled), "--runs", str(tmp_path / "r")]) == 2
    assert f"--against {garbled}: not UTF-8 text" in _error(capsys)
    garbled.write_text("| a | 1 |\n")
    assert main(["demo", "--reproduce", "--against", str(garbled), "--runs", str(tmp_path / "r")]) == 2
    assert "not a keepsight demo results.md" in _error(capsys)
    assert not (tmp_path / "r").exists()  # nothing ran


def test_rows_without_an_image_are_counted_in_the_preflight_line(tmp_path):
    from PIL import Image

    from keepsight.data import open_dataset, preflight

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    rows = [{"question": "what colour ?", "answer": "red", "image": "a.png"},
            {"question": "what shape ?", "answer": "a disc", "image": None}]  # null: text-only in this layout
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, report = preflight(open_dataset(data))
    assert report.text_only == 1 and "1 rows have no image (trained / asked as text-only)" in report.line()
