"""Visual Contrastive Decoding (Leng et al. 2024, "Mitigating Object Hallucinations in Large Vision-Language
Models through Visual Contrastive Decoding") as its authors released it (github DAMO-NLP-SG/VCD:
``vcd_utils/vcd_add_noise.py``, ``vcd_utils/vcd_sample.py``, ``experiments/eval/object_hallucination_vqa_llava.py``
for the defaults):

    logits = (1 + alpha) * l(y | v, x) - alpha * l(y | v', x)     on raw logits (vcd_sample.py line 152)

with v' the processor's (normalised) pixel tensor after ``noise_step`` steps of VCD's forward diffusion
(``v' = sqrt(abar_t) v + sqrt(1 - abar_t) eps``; its schedule: ``beta_s = sigmoid(linspace(-6, 6, 1000))_s *
(5e-3 - 1e-5) + 1e-5``, so abar_500 = 0.745), and the adaptive plausibility cut on the clean logits: tokens with
``l(y | v, x) < log(beta) + max l(y | v, x)`` get -inf (line 150). Defaults (the eval script's argparse): alpha 1,
beta 0.1, noise step 500; ``VCDConfig.pope()`` is the POPE script's beta 0.2 (``cd_scripts/llava1.5_pope.bash``).

Differences from the release, kept on purpose: the release patches only the sampling loop, so under greedy
decoding it computes nothing (the plain model); ours contrasts under every decoding mode (its scripts sample at
temperature 1 with no top-k / top-p: a user who wants that passes ``do_sample=True, top_k=0``). The release draws
the noise from the global RNG (image i's noise depends on the order of the questions); ours from a generator seeded
by ``seed`` and the image's own pixels, so a row gets the same noise alone or in a batch. The distorted stream is
the same model on v' with its own KV cache (``base.Stream``), as the release's (after its July 2024 fix).
``alpha = 0`` and ``beta = 0`` is the plain model, bit for bit.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..checks import number
from ..methods import register_method
from ..models.arch import arch_spec
from .base import Baseline, Stream, capture_image_inputs


@dataclass
class VCDConfig:
    # the settings at which the method must leave greedy and sampled decoding unchanged (ZERO) and must act (STRONG):
    # the registry's tests run every registered method at both on every family
    ZERO: ClassVar[dict] = {"alpha": 0.0, "beta": 0.0}
    STRONG: ClassVar[dict] = {"alpha": 1.0, "beta": 0.1}
    alpha: float = 1.0  # contrast strength (object_hallucination_vqa_llava.py --cd_alpha: 1)
    beta: float = 0.1  # adaptive plausibility cut (--cd_beta: 0.1; the POPE script: 0.2, VCDConfig.pope())
    noise_step: int = 500  # diffusion step of the distortion (--noise_step: 500 of vcd_add_noise.py's 1000)
    diffusion_steps: int = 1000
    seed: int = 0

    @classmethod
    def pope(cls, **settings) -> VCDConfig:
        """The release's POPE script (cd_scripts/llava1.5_pope.bash): alpha 1, beta 0.2, noise step 500."""
        return cls(**{"beta": 0.2, **settings})

    def __post_init__(self) -> None:
        self.alpha = number("alpha", self.alpha, low=0.0)
        self.beta = number("beta", self.beta, low=0.0, high=1.0)
        self.diffusion_steps = number("diffusion_steps", self.diffusion_steps, low=1, integer=True)
        self.noise_step = number("noise_step", self.noise_step, integer=True)
        if not 0 <= self.noise_step < self.diffusion_steps:
            raise ValueError(f"noise_step must lie in the schedule [0, {self.diffusion_steps}), got {self.noise_step}")
        self.seed = number("seed", self.seed, low=0, integer=True)


def alpha_bar(step: int, diffusion_steps: int = 1000) -> float:
    """prod_{s <= step} (1 - beta_s) of VCD's sigmoid schedule (float32, as vcd_add_noise.py computes it)."""
    betas = torch.sigmoid(torch.linspace(-6, 6, diffusion_steps)) * (0.5e-2 - 1e-5) + 1e-5
    return float(torch.cumprod(1 - betas, 0)[step])


def _split(pixel_values: torch.Tensor, grid: torch.Tensor | None) -> list[torch.Tensor]:
    """One tensor per image (or tile): ``[N, ...]`` by its first dim, flat patch rows (the "grid" layout) by the grid."""
    if grid is None:
        return list(pixel_values.unbind(0))
    return list(pixel_values.split([int(n) for n in grid.prod(-1)], 0))


def distort(pixel_values: torch.Tensor, ab: float, seed: int, grid: torch.Tensor | None = None) -> torch.Tensor:
    """Every image of ``pixel_values`` noised to ``sqrt(ab) v + sqrt(1 - ab) eps`` (``ab``: the schedule's alpha-bar
    at the noise step, ``alpha_bar``), the noise seeded by the image's own pixels."""
    out = []
    for img in _split(pixel_values, grid):
        key = zlib.crc32(img.detach().float().cpu().numpy().tobytes()) ^ seed
        g = torch.Generator().manual_seed(key)
        eps = torch.randn(img.shape, generator=g, dtype=torch.float32).to(img.device, img.dtype)
        noised = ab ** 0.5 * img + (1 - ab) ** 0.5 * eps
        if img.dim() >= 4:  # [tiles, C, H, W]: the processor pads a row's tiles with zeros; padding stays padding
            noised[img.flatten(1).eq(0).all(-1)] = 0
        out.append(noised)
    return torch.stack(out) if grid is None else torch.cat(out)


class VCD(Baseline):
    name = "vcd"

    def __init__(self, config: VCDConfig | None = None, **settings):
        super().__init__(config or VCDConfig(**settings))

    def alpha_bar(self) -> float:
        """The distorted image's share of signal: the schedule's alpha-bar at the configured noise step."""
        return alpha_bar(self.config.noise_step, self.config.diffusion_steps)

    def _install(self, model, stack) -> None:
        cfg = self.config
        ab = self.alpha_bar()
        grid_layout = arch_spec(model).image_layout == "grid"  # the row: pixel rows split by image_grid_thw
        stream = Stream(model)
        images = capture_image_inputs(model, stack, skip=lambda: stream.inside)

        def combine(kwargs, logits, prefill):
            if cfg.alpha == 0 and cfg.beta == 0:
                return logits
            kw = dict(kwargs)
            if kw.get("pixel_values") is None and kw.get("mm_encoder_outputs"):  # generate encoded them already
                kw.pop("mm_encoder_outputs")
                kw.update({k: v for k, v in images.items() if k not in kw and k != "return_dict"})
            if kw.get("pixel_values") is not None:
                grid = kw.get("image_grid_thw") if grid_layout else None
                kw["pixel_values"] = distort(kw["pixel_values"], ab, cfg.seed, grid)
            elif prefill:
                raise ValueError("VCD needs the image (pixel_values) on the forward that starts a sequence")
            distorted = stream.run(kw, prefill).logits
            out = (1 + cfg.alpha) * logits - cfg.alpha * distorted
            if cfg.beta <= 0:
                return out
            cutoff = math.log(cfg.beta) + logits.max(-1, keepdim=True).values  # vcd_sample.py line 150
            return out.masked_fill(logits < cutoff, float("-inf"))

        self._logits_hook(model, stack, combine, skip=lambda: stream.inside)


register_method("vcd", VCDConfig, VCD, family="autoregressive", needs="nothing (a noised copy of the image is made)")
