"""Multi-scale retention scan: chunked == for-loop reference (values, gradients, final state), dtypes, errors."""


import pytest
import torch

from keepsight.ops import multiscale_retention, naive_multiscale_retention, retention_step

LAMBDAS = [0.70, 0.90, 0.99, 0.995]


def _inputs(B, N, S, d, dtype=torch.float32, with_state=False):
    u = torch.randn(B, N, d, dtype=dtype)
    alpha = torch.softmax(torch.randn(B, N, S), dim=-1).to(dtype)
    lam = torch.tensor(LAMBDAS[-S:]) if S <= len(LAMBDAS) else torch.linspace(0.7, 0.995, S)
    h0 = torch.randn(B, S, d) if with_state else None
    return u, alpha, lam, h0


@pytest.mark.parametrize("N,chunk", [(1, 16), (37, 16), (130, 64), (130, 16), (64, 64)])
@pytest.mark.parametrize("S", [1, 3, 4])
@pytest.mark.parametrize("d", [1, 8])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_matches_loop_values_and_grads(N, chunk, S, d, with_state, dtype):
    u, alpha, lam, h0 = _inputs(2, N, S, d, dtype=dtype, with_state=with_state)
    lam = lam.to(dtype)
    h0 = None if h0 is None else h0.to(dtype)
    leaves = [u, alpha] + ([h0] if with_state else [])
    for t in leaves:
        t.requires_grad_(True)
    m, fin = multiscale_retention(u, alpha, lam, h0, chunk_size=chunk, return_final_state=True)
    m_ref, fin_ref = naive_multiscale_retention(u, alpha, lam, h0)
    assert m.dtype == dtype and fin.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(m, m_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(fin, fin_ref, atol=tol, rtol=tol)

    gm, gf = torch.randn_like(m), torch.randn_like(fin)
    grads = torch.autograd.grad((m * gm).sum() + (fin * gf).sum(), leaves)
    grads_ref = torch.autograd.grad((m_ref * gm).sum() + (fin_ref * gf).sum(), leaves)
    for g, g_ref in zip(grads, grads_ref):
        # gradients sum up to ~N terms of size ~|M|: fp32 rounding of either algorithm is ~1e-5 of the
        # gradient's scale, so the absolute tolerance is relative to that scale (exact in fp64)
        scale = max(1.0, g_ref.abs().max().item())
        torch.testing.assert_close(g, g_ref, atol=tol * scale, rtol=tol)


def test_output_only_matches_and_lambda_one_is_cumsum():
    u, alpha, lam, _ = _inputs(2, 100, 3, 5)
    m_ref, _ = naive_multiscale_retention(u, alpha, lam)
    torch.testing.assert_close(multiscale_retention(u, alpha, lam, chunk_size=32), m_ref, atol=1e-5, rtol=1e-5)
    # lambda = 1 (allowed by the op), S = 1, alpha = 1: a running sum
    m = multiscale_retention(u, torch.ones(2, 100, 1), torch.ones(1), chunk_size=16)
    torch.testing.assert_close(m, u.cumsum(dim=1), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype):
    u, alpha, lam, _ = _inputs(2, 200, 4, 16)
    m_ref, fin_ref = naive_multiscale_retention(u, alpha, lam)
    m, fin = multiscale_retention(u.to(dtype), alpha.to(dtype), lam, chunk_size=64, return_final_state=True)
    assert m.dtype == dtype and fin.dtype == torch.float32
    # error is dominated by rounding the inputs (and the output) to 8/11 mantissa bits
    tol = 5e-2 if dtype == torch.bfloat16 else 5e-3
    torch.testing.assert_close(m.float(), m_ref, atol=tol * m_ref.abs().max().item(), rtol=tol)
    torch.testing.assert_close(fin, fin_ref, atol=tol * fin_ref.abs().max().item(), rtol=tol)


def test_retention_step_matches_scan():
    u, alpha, lam, h0 = _inputs(3, 50, 4, 6, with_state=True)
    m, fin = multiscale_retention(u, alpha, lam, h0, chunk_size=16, return_final_state=True)
    state, outs = h0, []
    for t in range(u.shape[1]):
        m_t, state = retention_step(u[:, t], alpha[:, t], lam, state)
        assert m_t.shape == (3, 6) and state.shape == (3, 4, 6)
        outs.append(m_t)
    torch.testing.assert_close(torch.stack(outs, dim=1), m, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, fin, atol=1e-5, rtol=1e-5)


def test_split_sequence_with_carried_state():
    u, alpha, lam, _ = _inputs(2, 150, 4, 8)
    m, fin = multiscale_retention(u, alpha, lam, chunk_size=32, return_final_state=True)
    m1, s1 = multiscale_retention(u[:, :61], alpha[:, :61], lam, chunk_size=32, return_final_state=True)
    m2, s2 = multiscale_retention(u[:, 61:], alpha[:, 61:], lam, s1, chunk_size=32, return_final_state=True)
    torch.testing.assert_close(torch.cat([m1, m2], dim=1), m, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s2, fin, atol=1e-5, rtol=1e-5)


def test_errors():
    u, alpha, lam, _ = _inputs(2, 10, 4, 8)
    with pytest.raises(ValueError, match="empty sequence"):
        multiscale_retention(u[:, :0], alpha[:, :0], lam)
    with pytest.raises(ValueError, match=r"alpha shape \(2, 9, 4\) does not match u shape \(2, 10, 8\)"):
        multiscale_retention(u, alpha[:, :9], lam)
    with pytest.raises(ValueError, match="lambdas has 3 scales"):
        multiscale_retention(u, alpha, lam[:3])
    with pytest.raises(ValueError, match=r"initial_state shape \(2, 4, 7\)"):
        multiscale_retention(u, alpha, lam, torch.zeros(2, 4, 7))
    for bad in ([0.5, 0.9, 1.2, 0.9], [0.0, 0.9, 0.9, 0.9], [-0.5, 0.9, 0.9, 0.9], [float("nan")] * 4):
        with pytest.raises(ValueError, match=r"lambdas must each lie in \(0, 1\]"):
            multiscale_retention(u, alpha, torch.tensor(bad))
    with pytest.raises(ValueError, match="chunk_size"):
        multiscale_retention(u, alpha, lam, chunk_size=0)
    with pytest.raises(ValueError, match=r"u must be a tensor \[B, N, d\]"):
        multiscale_retention(u[0], alpha, lam)


def test_non_contiguous_inputs():
    u, alpha, lam, _ = _inputs(2, 45, 3, 8)
    u_t = u.transpose(0, 1).contiguous().transpose(0, 1)  # same values, non-contiguous strides
    assert not u_t.is_contiguous()
    torch.testing.assert_close(multiscale_retention(u_t, alpha, lam, chunk_size=16),
                               multiscale_retention(u, alpha, lam, chunk_size=16))
