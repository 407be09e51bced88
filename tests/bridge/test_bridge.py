"""Bridges: LIA-MTR streaming == full forward, half-lives, the linear-attention bridge,
baselines, and input validation."""

import math

import pytest
import torch
import torch.nn.functional as F

from keepsight.bridge import (
    BRIDGE_KINDS,
    AttentionBridge,
    LiaMtrBridge,
    LiaMtrConfig,
    LinearAttentionBridge,
    MLPBridge,
    build_bridge,
)

DV, DM = 12, 16


def _lia(**kw) -> LiaMtrBridge:
    return LiaMtrBridge(LiaMtrConfig(d_vision=DV, d_model=DM, **kw)).eval()


@pytest.mark.parametrize("kw", [{}, {"conv_kernel": 0}, {"conv_kernel": 1, "use_gate": False}, {"d_inner": 8}])
def test_forward_equals_token_by_token_steps(kw):
    bridge = _lia(chunk_size=8, **kw)
    x = torch.randn(2, 29, DV)
    with torch.no_grad():
        y, final = bridge(x, return_state=True)
        state, outs = None, []
        for t in range(x.shape[1]):
            y_t, state = bridge.step(x[:, t], state)
            outs.append(y_t)
    assert y.shape == (2, 29, DM)
    torch.testing.assert_close(torch.stack(outs, dim=1), y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.retention, final.retention, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state.conv, final.conv, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("split", [1, 2, 17, 40])
def test_two_halves_with_carried_state_equal_full_forward(split):
    bridge = _lia(chunk_size=16)
    x = torch.randn(2, 41, DV)
    with torch.no_grad():
        y = bridge(x)
        y1, s = bridge(x[:, :split], return_state=True)
        y2 = bridge(x[:, split:], state=s)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, atol=1e-5, rtol=1e-5)


def test_gradients_flow_to_all_parameters():
    bridge = _lia(chunk_size=8)
    bridge(torch.randn(2, 20, DV)).square().mean().backward()
    for name, p in bridge.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert "lambdas" not in dict(bridge.named_parameters())


def test_config_lambdas_and_half_lives():
    cfg = LiaMtrConfig(d_vision=DV, d_model=DM)
    lam = cfg.lambda_values()
    assert cfg.n_scales == 4 and cfg.d_inner == DM
    assert lam[0] == pytest.approx(0.70) and lam[-1] == pytest.approx(0.995)
    ratios = [lam[i + 1] / lam[i] for i in range(3)]
    assert ratios == pytest.approx([ratios[0]] * 3)  # geometric spacing
    hl = cfg.half_lives()
    assert round(hl[0], 2) == 1.94 and round(hl[-1], 2) == 138.28
    bridge = LiaMtrBridge(cfg)
    assert bridge.half_lives() == pytest.approx(hl)
    torch.testing.assert_close(bridge.lambdas, torch.tensor(lam, dtype=torch.float32))
    explicit = LiaMtrConfig(d_vision=DV, d_model=DM, lambdas=[0.5, 0.9])
    assert explicit.n_scales == 2 and explicit.half_lives() == pytest.approx([1.0, math.log(0.5) / math.log(0.9)])


def test_linear_attention_bridge_is_cumulative():
    bridge = LinearAttentionBridge(DV, DM, chunk_size=8)
    x = torch.randn(2, 21, DV)
    with torch.no_grad():
        y = bridge(x)
        q, k, v = bridge.qkv(x).chunk(3, dim=-1)
        ref = bridge.out((F.elu(q) + 1) * ((F.elu(k) + 1) * v).cumsum(dim=1))
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)


def test_attention_naive_equals_sdpa():
    naive = AttentionBridge(DV, DM, n_heads=4, impl="naive")
    sdpa = AttentionBridge(DV, DM, n_heads=4, impl="sdpa")
    sdpa.load_state_dict(naive.state_dict())
    x = torch.randn(3, 19, DV)
    with torch.no_grad():
        torch.testing.assert_close(naive(x), sdpa(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", BRIDGE_KINDS)
def test_factory_shapes(kind):
    kw = {"n_heads": 4} if kind.startswith("attention") else {}
    bridge = build_bridge(kind, DV, DM, **kw)
    assert bridge(torch.randn(2, 7, DV)).shape == (2, 7, DM)
    with pytest.raises(ValueError, match=r"expected d_vision = 12, got 13"):
        bridge(torch.randn(2, 7, DV + 1))
    with pytest.raises(ValueError, match="empty sequence"):
        bridge(torch.randn(2, 0, DV))
    x = torch.randn(1, 5, DV)
    x[0, 3, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        bridge(x)
    x[0, 3, 1] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        bridge(x)


def test_factory_and_class_types():
    assert isinstance(build_bridge("mlp", DV, DM), MLPBridge)
    assert build_bridge("attention", DV, DM, n_heads=2).impl == "naive"
    assert build_bridge("attention_sdpa", DV, DM, n_heads=2).impl == "sdpa"
    assert build_bridge("lia_mtr", DV, DM, n_scales=3).config.n_scales == 3
    with pytest.raises(ValueError, match="unknown bridge kind 'conv'.*mlp, lia_mtr, attention"):
        build_bridge("conv", DV, DM)


def test_bad_configs_and_inputs():
    with pytest.raises(ValueError, match="lambdas must each lie strictly"):
        LiaMtrConfig(d_vision=DV, d_model=DM, lambdas=[0.9, 0.0])
    with pytest.raises(ValueError, match="lambdas must each lie strictly"):
        LiaMtrConfig(d_vision=DV, d_model=DM, lambdas=[0.9, -0.5])
    with pytest.raises(ValueError, match=r"lambda_max must be in \(0.0, 1.0\)"):
        LiaMtrConfig(d_vision=DV, d_model=DM, lambda_max=1.0)
    with pytest.raises(ValueError, match="lambda_min"):
        LiaMtrConfig(d_vision=DV, d_model=DM, lambda_min=0.99, lambda_max=0.9)
    with pytest.raises(ValueError, match="n_scales = 3 but lambdas has 2"):
        LiaMtrConfig(d_vision=DV, d_model=DM, n_scales=3, lambdas=[0.5, 0.9])
    for field, value in [("d_vision", 0), ("d_model", -1), ("d_inner", 0), ("n_scales", 0),
                         ("conv_kernel", -1), ("chunk_size", 0), ("use_gate", 1)]:
        kw = {"d_vision": DV, "d_model": DM, field: value}
        with pytest.raises(ValueError, match=field):
            LiaMtrConfig(**kw)
    with pytest.raises(ValueError, match="divisible by n_heads"):
        AttentionBridge(DV, 10, n_heads=4)
    bridge = _lia()
    with pytest.raises(ValueError, match=r"x_t: feature width mismatch, expected d_vision = 12, got 5"):
        bridge.step(torch.randn(2, 5))
    _, state = bridge(torch.randn(2, 4, DV), return_state=True)
    with pytest.raises(ValueError, match=r"state.conv shape \(2, 3, 12\) does not match expected \(3, 3, 12\)"):
        bridge(torch.randn(3, 4, DV), state=state)


def test_bf16_module_keeps_fp32_decays():
    bridge = _lia(chunk_size=16)
    x = torch.randn(2, 40, DV)
    with torch.no_grad():
        y = bridge(x)
        half = bridge.to(torch.bfloat16)
        y16, state = half(x.to(torch.bfloat16), return_state=True)
    assert y16.dtype == torch.bfloat16 and state.retention.dtype == torch.float32
    assert half._lam().dtype == torch.float32 and half._lam()[-1].item() == pytest.approx(0.995, abs=1e-6)
    torch.testing.assert_close(y16.float(), y, atol=0.05 * y.abs().max().item(), rtol=0.05)


def test_blocked_forward_equals_one_block():
    """Inputs longer than block_size run block by block with the carried state: same result, same grads."""
    from keepsight.bridge import LiaMtrBridge, LiaMtrConfig

    torch.manual_seed(0)
    bridge = LiaMtrBridge(LiaMtrConfig(d_vision=6, d_model=5, chunk_size=8))
    x = torch.randn(2, 50, 6, requires_grad=True)
    full = bridge(x)
    (g_full,) = torch.autograd.grad(full.square().sum(), x)
    bridge.block_size = 16  # 50 = 16 + 16 + 16 + 2
    blocked = bridge(x)
    (g_blocked,) = torch.autograd.grad(blocked.square().sum(), x)
    torch.testing.assert_close(blocked, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_blocked, g_full, rtol=1e-5, atol=1e-5)


def test_inputs_the_bridge_cannot_represent_and_models_it_does_not_fit_are_refused():
    from keepsight.bridge import replace_projector
    from keepsight.world.models import build_llada_v
    from keepsight.world.processor import build_processor

    bridge = LiaMtrBridge(LiaMtrConfig(d_vision=8, d_model=16))
    with pytest.raises(ValueError, match="the LIA-MTR output is not finite: inputs as large as 1e\\+30 overflow"):
        bridge(torch.full((1, 3, 8), 1e30))
    with pytest.raises(ValueError, match="replace_projector supports LLaVA-family models, got NoneType$"):
        replace_projector(None, "lia_mtr")
    with pytest.raises(ValueError, match="has a masked-diffusion language model"):
        replace_projector(build_llada_v(build_processor()), "lia_mtr")
