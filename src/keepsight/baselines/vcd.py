"""Visual Contrastive Decoding (Leng et al. 2024, "Mitigating Object Hallucinations in Large Vision-Language
Models through Visual Contrastive Decoding"), written from the paper's equations.

    logits = (1 + alpha) * l(y | v, x) - alpha * l(y | v', x)

with v' the image after ``noise_step`` steps of the forward diffusion process (linear betas from 1e-4 to 0.02
over ``diffusion_steps`` = 1000: ``v' = sqrt(abar_t) v + sqrt(1 - abar_t) eps``, applied to the processor's
pixel tensor), and the adaptive plausibility constraint: tokens whose probability under l(y | v, x) is below
``beta`` times the most likely token's are cut (-inf). Paper defaults: alpha = 1, beta = 0.1, noise step 500.

The distorted stream is the same model on v' with its own KV cache (``base.Stream``). Each image's noise is drawn
from a generator seeded by ``seed`` and the image's own pixels, so a row gets the same noise alone or in a batch.
``alpha = 0`` (and ``beta = 0``) is the plain model, bit for bit.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from .base import Baseline, Stream, capture_image_inputs, number, plausibility_cut


@dataclass
class VCDConfig:
    alpha: float = 1.0  # contrast strength (paper: 1)
    beta: float = 0.1  # adaptive plausibility cut (paper: 0.1)
    noise_step: int = 500  # diffusion step of the distortion (paper: 500 of 1000)
    diffusion_steps: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        self.alpha = number("alpha", self.alpha, low=0.0)
        self.beta = number("beta", self.beta, low=0.0, high=1.0)
        self.diffusion_steps = number("diffusion_steps", self.diffusion_steps, low=1, integer=True)
        self.noise_step = number("noise_step", self.noise_step, integer=True)
        if not 0 <= self.noise_step < self.diffusion_steps:
            raise ValueError(f"noise_step must lie in the schedule [0, {self.diffusion_steps}), got {self.noise_step}")
        self.seed = number("seed", self.seed, low=0, integer=True)


def alpha_bar(step: int, diffusion_steps: int = 1000) -> float:
    """prod_{s <= step} (1 - beta_s) of the linear schedule beta_s in [1e-4, 0.02]."""
    betas = torch.linspace(1e-4, 0.02, diffusion_steps, dtype=torch.float64)
    return float(torch.cumprod(1 - betas, 0)[step])


def _split(pixel_values: torch.Tensor, grid: torch.Tensor | None) -> list[torch.Tensor]:
    """One tensor per image: LLaVA's ``[N, C, H, W]`` by its first dim, Qwen-VL's flat patches by the grid."""
    if grid is None:
        return list(pixel_values.unbind(0))
    return list(pixel_values.split([int(n) for n in grid.prod(-1)], 0))


def distort(pixel_values: torch.Tensor, step: int, seed: int, grid: torch.Tensor | None = None,
            diffusion_steps: int = 1000) -> torch.Tensor:
    """Every image of ``pixel_values`` after ``step`` forward-diffusion steps, noise seeded by its own pixels."""
    ab = alpha_bar(step, diffusion_steps)
    out = []
    for img in _split(pixel_values, grid):
        key = zlib.crc32(img.detach().float().cpu().numpy().tobytes()) ^ seed
        g = torch.Generator().manual_seed(key)
        eps = torch.randn(img.shape, generator=g, dtype=torch.float32).to(img.device, img.dtype)
        out.append(ab ** 0.5 * img + (1 - ab) ** 0.5 * eps)
    return torch.stack(out) if grid is None else torch.cat(out)


class VCD(Baseline):
    name = "vcd"

    def __init__(self, config: VCDConfig | None = None, **settings):
        super().__init__(config or VCDConfig(**settings))

    def _install(self, model, stack) -> None:
        cfg = self.config
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
                kw["pixel_values"] = distort(kw["pixel_values"], cfg.noise_step, cfg.seed, kw.get("image_grid_thw"),
                                             cfg.diffusion_steps)
            elif prefill:
                raise ValueError("VCD needs the image (pixel_values) on the forward that starts a sequence")
            distorted = stream.run(kw, prefill).logits
            out = (1 + cfg.alpha) * logits - cfg.alpha * distorted
            return plausibility_cut(out, logits, cfg.beta)

        self._logits_hook(model, stack, combine, skip=lambda: stream.inside)
