"""``Pipeline`` on a masked-diffusion model in memory (``from_model``): the path of the world's diffusion experiment
and ``bench diffusion``. Its answers are the saved checkpoint's; ``diffuse`` is ``keepsight.diffusion.generate`` with
the model's banned ids and mask rule; ``texts`` cuts each row at its first end id; the experiment's runner encodes
and samples exactly as a direct processor + sampler call does."""

import pytest
import torch

from keepsight.data import chat_example
from keepsight.diffusion import generate
from keepsight.diffusion.ends import end_ids, suppressed_ids
from keepsight.experiments.diffusion import _Runner
from keepsight.inference import Pipeline
from keepsight.world import generate_scenes, world_config
from keepsight.world.tasks import WorldSamples
from keepsight.world.texts import DESCRIBE_PROMPT

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def samples():
    cfg = world_config()
    return WorldSamples.from_scenes(cfg, generate_scenes(cfg, 3, seed=0))


def _direct(vlm, processor, samples, steps, **settings):
    """The runner's old path, written out: one processor call, the sampler, the cut, the decode."""
    tok = processor.tokenizer
    enc = processor(text=[chat_example(processor, DESCRIBE_PROMPT)] * len(samples), images=samples.images,
                    return_tensors="pt", padding=True)
    out = generate(vlm, enc["input_ids"], enc["attention_mask"], enc["pixel_values"], gen_length=16, steps=steps,
                   suppress_token_ids=suppressed_ids(vlm, tok), generator=torch.Generator().manual_seed(0), **settings)
    ends = end_ids(vlm, tok)
    rows = [row[: next((j for j, t in enumerate(row) if t in ends), len(row))] for row in out.generated.tolist()]
    return enc, out, [tok.decode(r, skip_special_tokens=True).strip() for r in rows]


def test_the_diffusion_experiments_runner_samples_as_a_direct_sampler_call(vlm, processor, samples):
    runner = _Runner(vlm, processor, samples, gen_length=16)
    enc, out, texts = _direct(vlm, processor, samples, 4)
    assert runner.pipe.chat_prompt(DESCRIBE_PROMPT, 1) == chat_example(processor, DESCRIBE_PROMPT)
    assert set(runner.enc) == set(enc) and all(torch.equal(runner.enc[k], enc[k]) for k in enc)
    mine = runner.pipe.diffuse(runner.enc, steps=4)
    assert torch.equal(mine.generated, out.generated) and mine.forwards == out.forwards
    assert runner.pipe.texts(mine.generated) == texts
    assert runner.run(4)["example"] == texts[0]
    # a sampler's own block length replaces the runner's (one block over the window)
    _, cached, _ = _direct(vlm, processor, samples, 4, block_length=8, cache="dual")
    assert torch.equal(runner.pipe.diffuse(runner.enc, steps=4, block_length=8, cache="dual").generated,
                       cached.generated)


def test_a_diffusion_model_in_memory_decodes_as_its_saved_checkpoint(vlm, processor, samples, tmp_path):
    vlm.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    questions = ["describe the image in detail ."] * 2
    images = samples.images[:2]
    settings = {"steps": 4, "gen_length": 8, "mps": {}, "mrs": {}}
    loaded = Pipeline(tmp_path, device="cpu", method="diffusion", **settings).generate(questions, images)
    pipe = Pipeline.from_model(vlm, processor, **settings)
    assert pipe.method == "diffusion" and pipe.decoders.names() == ["mps", "mrs"]
    mine = pipe.generate(questions, images)
    assert mine.texts == loaded.texts and mine.stats.keys() == loaded.stats.keys()


def test_from_model_refuses_what_its_model_cannot_take(vlm, processor):
    from keepsight.world.models import build_model

    with pytest.raises(TypeError, match=r"unknown settings \['dtype'\]"):
        Pipeline.from_model(vlm, processor, dtype="float32")
    with pytest.raises(ValueError, match="baseline=vcd decodes autoregressive models; method is diffusion"):
        Pipeline.from_model(vlm, processor, baseline="vcd")
    ar = build_model("tiny-llava", processor.tokenizer)
    with pytest.raises(ValueError, match="steps only apply to method=diffusion"):
        Pipeline.from_model(ar, processor, steps=4)
    with pytest.raises(ValueError, match="diffuse\\(\\) decodes masked-diffusion models; method is none"):
        Pipeline.from_model(ar, processor).diffuse({"input_ids": torch.ones(1, 3, dtype=torch.long)})
