"""``keepsight.methods``: the registry every method is listed in once, by the package that holds it."""

import dataclasses
import importlib.metadata
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from keepsight import methods
from keepsight.baselines import BASELINES
from keepsight.cli import build_parser
from keepsight.commands.method_options import diffusion_methods
from keepsight.inference import METHODS, get_method, method_names, register_method
from keepsight.inference.support import columns, support
from keepsight.integrations.lmms_eval import KeepsightLMM
from keepsight.world import generate_scenes, render, world_config


def test_a_package_registers_its_methods_when_imported():
    """The registry alone holds nothing; importing a package registers the methods it holds (the bridged checkpoint,
    the baselines, the diffusion sampler with its fixes, PVM), and the inference layer adds the plain checkpoint: no
    list of the methods anywhere else."""
    steps = ("keepsight.bridge", "keepsight.baselines", "keepsight.diffusion", "keepsight.pvm", "keepsight.inference")
    code = "from keepsight.methods import METHODS; print(sorted(METHODS))" + "".join(
        f"; import {m}; print(sorted(METHODS))" for m in steps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    after = [[], ["bridge"], ["bridge", *BASELINES], ["bridge", *BASELINES, "diffusion", "mps", "mrs"],
             ["bridge", *BASELINES, "diffusion", "mps", "mrs", "pvm"],
             ["bridge", *BASELINES, "diffusion", "mps", "mrs", "pvm", "none"]]
    assert out == [str(sorted(names)) for names in after]


def test_every_method_is_registered_once_with_its_stage_and_family():
    assert method_names("load") == ["bridge", "diffusion", "none", "pvm"]
    assert set(method_names("decode", "autoregressive")) == set(BASELINES)
    assert method_names("decode", "diffusion") == ["mps", "mrs"]
    for name, (cls, config) in BASELINES.items():
        entry = METHODS[name]
        assert entry.config is config and entry.build is cls and entry.needs
        assert isinstance(entry.make(), cls)  # the config's defaults


def test_registry_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match=r"unknown method 'dola'; choose from \['deco', 'memvr', 'opera', 'pai', "
                                         r"'vcd'\]"):
        get_method("dola", stage="decode", family="autoregressive")
    with pytest.raises(ValueError, match="unknown method 'mps'"):  # a diffusion method on an autoregressive model
        get_method("mps", family="autoregressive")
    with pytest.raises(ValueError, match="already registered"):
        register_method("vcd", *BASELINES["vcd"][::-1])
    with pytest.raises(ValueError, match="needs a config dataclass"):
        register_method("broken", dict, dict)
    with pytest.raises(ValueError, match="check, attach, takes and requires apply to model-side methods"):
        register_method("broken", *BASELINES["vcd"][::-1], takes=("pvm",))
    with pytest.raises(ValueError, match=r"vcd: .*unexpected keyword argument 'strength'.*its settings: \["):
        METHODS["vcd"].make({"strength": 1.0})
    with pytest.raises(ValueError, match="alpha must be >= 0.0"):  # the config's own check
        METHODS["vcd"].make({"alpha": -1.0})
    with pytest.raises(ValueError, match="part of the model"):
        METHODS["pvm"].make()


NUDGE = '''
import contextlib
from dataclasses import dataclass
from typing import ClassVar

from keepsight.methods import register_method


@dataclass
class NudgeConfig:
    """Logit nudge (a diffusion method written as one package)."""

    TESTED_BY: ClassVar[str] = "tests/test_methods.py"
    scale: float = 1.0  # multiplies nothing: the method counts the batches it was applied to


class Nudge:
    def __init__(self, config):
        self.config, self.batches = config, 0

    @contextlib.contextmanager
    def apply(self, model):
        self.batches += 1
        yield self

    def stats(self):
        return {"batches": self.batches, "scale": self.config.scale}


register_method("nudge", NudgeConfig, Nudge, family="diffusion", needs="nothing")
'''


@pytest.fixture
def nudge(tmp_path, monkeypatch):
    """A diffusion decoding method written as one package outside keepsight, declared under the ``keepsight.methods``
    entry point group (as its own pyproject.toml would) and loaded as keepsight loads every such package."""
    (tmp_path / "nudge").mkdir()
    (tmp_path / "nudge" / "__init__.py").write_text(NUDGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    declared = [EntryPoint("nudge", "nudge", methods.GROUP)]
    monkeypatch.setattr(methods, "entry_points", lambda group: declared if group == methods.GROUP else [])
    assert "nudge" not in METHODS and methods.load_method_packages() == ["nudge"]
    yield sys.modules["nudge"]
    METHODS.pop("nudge", None)
    sys.modules.pop("nudge", None)


def test_a_package_that_does_not_import_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(methods, "entry_points", lambda group: [EntryPoint("broken", "no_such_module", methods.GROUP)])
    with pytest.raises(ImportError, match="entry point broken = no_such_module did not import"):
        methods.load_method_packages()


def test_keepsight_declares_its_own_method_packages():
    declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=methods.GROUP)}
    assert declared["baselines"] == "keepsight.baselines" and declared["diffusion"] == "keepsight.diffusion"


@pytest.mark.parametrize("name, where", [("steps", "cli"), ("sampler", "cli"), ("max_new_tokens", "cli"),
                                         ("data", "cli"), ("threads", "cli"), ("seed", "lmms"), ("baseline_x", "lmms"),
                                         ("block", "lmms")])
def test_a_method_named_like_keepsights_own_options_is_refused_by_name(name, where):
    """A diffusion method called like a command's option (``--steps``, ``--sampler.FIELD``) or a model argument of
    lmms-eval's (``seed=``, ``baseline_*``) could not be switched on: the command line and lmms-eval say which method
    (and which module registered it) instead of breaking or ignoring it."""
    fields = [("length", int, 1)] if name == "block" else [("scale", float, 1.0)]  # block_length: a model argument
    register_method(name, dataclasses.make_dataclass("NudgeConfig", fields), lambda c: c, family="diffusion")
    try:
        if where == "cli":
            with pytest.raises(ValueError, match=rf"decoding method '{name}' \(registered by .*\): the command uses "
                                                 rf"--{name.replace('_', '-')}"):
                build_parser()
        if name not in ("data", "threads"):  # not model arguments of lmms-eval's
            with pytest.raises(ValueError, match=rf"diffusion method '{name}' \(registered by .*\) is named like one "
                                                 "of keepsight's own model arguments"):
                KeepsightLMM(pretrained="unused")
    finally:
        METHODS.pop(name)
    build_parser()  # without it the commands build again


def test_two_diffusion_methods_whose_flat_settings_would_mix_are_refused():
    with pytest.raises(ValueError, match="could not be told from those of the registered method 'mps'"):
        register_method("mps_fast", *BASELINES["vcd"][::-1], family="diffusion")
    assert "mps_fast" not in METHODS
    register_method("vcd_v2", *BASELINES["vcd"][::-1])  # autoregressive settings are baseline_FIELD: no mix
    METHODS.pop("vcd_v2")


@pytest.fixture
def images():
    cfg = world_config()
    return [render(s, cfg.noise_std) for s in generate_scenes(cfg, 1, seed=0)]


def test_a_new_decoding_method_is_one_package(nudge, processor, vlm, images, tmp_path):
    """With no other file touched, the package's method is on the command line (its switch and its options), in
    lmms-eval's model arguments, in the support matrix, and the Pipeline decodes with it."""
    args = build_parser().parse_args(["eval", "generate", "--model", "m", "--data", "d", "--out", "o.jsonl",
                                      "--diffusion", "--nudge.scale", "2"])
    assert diffusion_methods(args) == {"nudge": {"scale": 2.0}}
    assert ("nudge", "diffusion") in columns() and support("llada_v")["nudge"] is None
    llada = tmp_path / "llada"
    vlm.save_pretrained(llada)
    processor.save_pretrained(llada)
    lm = KeepsightLMM(pretrained=str(llada), device="cpu", method="diffusion", nudge_scale="3", steps=2, gen_length=4)
    assert lm.decoding == {"nudge": {"scale": 3.0}}
    out = lm.generate(["describe the image ."], images[:1])
    assert out.stats["nudge"] == {"batches": 1, "scale": 3.0}
