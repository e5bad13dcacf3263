"""The C++ kernels (one-row and few-row products, weightless RMSNorm) equal torch, forward and backward, and can be switched off."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from site_lens.engine import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C++ compiler/ninja: kernels fall back to torch")

# (K, N): tiny, not a multiple of the 8-row unroll, and large enough for the multi-threaded path
SHAPES = [(3, 5), (13, 7), (576, 960), (1539, 576), (64, 3000)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
def test_row_matmul_equals_torch_forward_and_backward(shape, threads):
    K, N = shape
    w = torch.randn(K, N)
    x = torch.randn(1, K, requires_grad=True)
    g = torch.randn(1, N)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = kernels.row_matmul(x, w)
        (gx,) = torch.autograd.grad(y, x, g)
    finally:
        torch.set_num_threads(old)
    x_ref = x.detach().clone().requires_grad_()
    y_ref = x_ref @ w
    (gx_ref,) = torch.autograd.grad(y_ref, x_ref, g)
    assert y.shape == y_ref.shape and gx.shape == gx_ref.shape
    assert torch.allclose(y, y_ref, rtol=1e-5, atol=1e-4), (y - y_ref).abs().max()
    assert torch.allclose(gx, gx_ref, rtol=1e-5, atol=1e-4), (gx - gx_ref).abs().max()
    assert "RowMatmul" in y.grad_fn.name()  # the kernel ran, not torch's matmul


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 32])
@pytest.mark.parametrize("shape", SHAPES + [(576, 1000)])  # and columns past the 256-column tiles, uneven
def test_rows_matmul_equals_torch_forward_and_backward(shape, rows, threads):
    K, N = shape
    w = torch.randn(K, N)
    x = torch.randn(rows, K, requires_grad=True)
    g = torch.randn(rows, N)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = kernels.rows_matmul(x, w)
        (gx,) = torch.autograd.grad(y, x, g)
    finally:
        torch.set_num_threads(old)
    (gx_ref,) = torch.autograd.grad(x @ w, x, g)
    assert torch.allclose(y, x.detach() @ w, rtol=1e-5, atol=1e-4), (y - x.detach() @ w).abs().max()
    assert torch.allclose(gx, gx_ref, rtol=1e-5, atol=1e-4), (gx - gx_ref).abs().max()
    assert "RowsMatmul" in y.grad_fn.name()
    one = torch.cat([kernels.load().row_times(r[None].contiguous(), w, 1) for r in x.detach()])
    assert torch.allclose(kernels.load().rows_times(x.detach().contiguous(), w, 1), one, rtol=1e-6, atol=1e-6)


def test_rows_matmul_leading_dims_and_fallbacks():
    w = torch.randn(8, 6)
    x = torch.randn(2, 3, 8)  # (batch, n, d): six rows
    assert torch.allclose(kernels.rows_matmul(x, w), x @ w, atol=1e-5)
    many = torch.randn(kernels.MAX_ROWS + 1, 8)  # past the kernel's rows: torch's matmul
    assert kernels.rows_matmul(many, w).equal(many @ w)
    with pytest.raises(RuntimeError, match="shape"):
        kernels.load().rows_times(torch.randn(kernels.MAX_ROWS + 1, 8), w, 1)
    with kernels.disabled():
        assert kernels.rows_matmul(x, w).equal(x @ w)


def test_row_matmul_weight_gradient_when_asked():
    w = torch.randn(20, 30, requires_grad=True)
    x = torch.randn(1, 20, requires_grad=True)
    g = torch.randn(1, 30)
    gx, gw = torch.autograd.grad(kernels.row_matmul(x, w), (x, w), g)
    assert torch.allclose(gw, x.detach().T @ g, atol=1e-5)
    assert torch.allclose(gx, g @ w.detach().T, atol=1e-5)


def test_row_matmul_falls_back_for_what_the_kernel_does_not_take():
    w = torch.randn(8, 6)
    for x, ww in [
        (torch.randn(3, 8), w),  # several rows: torch's matmul
        (torch.randn(1, 8, dtype=torch.float64), w.double()),  # not float32
        (torch.randn(1, 8), torch.randn(6, 8).T),  # a non-contiguous matrix
        (torch.randn(1, 2, 8), w),  # not one row: a (1, pos, d) activation
    ]:
        y = kernels.row_matmul(x, ww)
        assert torch.allclose(y, x @ ww)
        assert y.grad_fn is None  # nothing required grad; and it was not the kernel's node
    with kernels.disabled():
        assert kernels.row_matmul(torch.ones(1, 8), w).equal(torch.ones(1, 8) @ w)
    assert kernels.available()  # restored after the block


def test_kernel_rejects_bad_shapes_with_a_clear_error():
    ext = kernels.load()
    with pytest.raises(RuntimeError, match="shape"):
        ext.row_times(torch.randn(1, 7), torch.randn(8, 6), 1)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        ext.row_times(torch.randn(1, 8), torch.randn(8, 6, dtype=torch.float64), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_equals_torch_forward_and_backward(dtype):
    x = (torch.randn(3, 2, 50, dtype=dtype) * 3).requires_grad_()
    g = torch.randn(3, 2, 50, dtype=dtype)
    y = kernels.rms_norm(x, 1e-6)
    (gx,) = torch.autograd.grad(y, x, g)
    x_ref = x.detach().clone().requires_grad_()
    y_ref = x_ref / (x_ref.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()  # TransformerLens's RMSNorm, w = 1
    (gx_ref,) = torch.autograd.grad(y_ref, x_ref, g)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(y, y_ref, atol=tol) and torch.allclose(gx, gx_ref, atol=tol)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda v: kernels.rms_norm(v, 1e-6), (x[:1, :1, :6].detach().requires_grad_(),))
    with kernels.disabled():
        assert torch.allclose(kernels.rms_norm(x, 1e-6), F.rms_norm(x, (50,), None, 1e-6))


def test_second_derivatives_through_the_kernels_are_right():
    """Under create_graph the backward passes switch to torch's ops, so gradients of gradients hold."""
    w = torch.randn(40, 30)
    x = torch.randn(1, 40, dtype=torch.float32, requires_grad=True)

    def f(v, mm, rms):
        y = rms(mm(v, w), 1e-6)
        return (y * torch.linspace(-1, 1, 30)).sum() ** 2

    got = torch.autograd.grad(f(x, kernels.row_matmul, kernels.rms_norm), x, create_graph=True)[0]
    hvp = torch.autograd.grad(got.pow(2).sum(), x)[0]
    xr = x.detach().clone().requires_grad_()

    def ref_rms(v, eps):
        return F.rms_norm(v, (v.shape[-1],), None, eps)

    want = torch.autograd.grad(f(xr, torch.matmul, ref_rms), xr, create_graph=True)[0]
    hvp_ref = torch.autograd.grad(want.pow(2).sum(), xr)[0]
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    assert torch.allclose(hvp, hvp_ref, rtol=1e-3, atol=1e-4), (hvp - hvp_ref).abs().max()


def test_build_uses_a_copy_of_the_source_in_the_cache(monkeypatch, tmp_path):
    """Checkouts at different paths sharing one cache must not rebuild each other's kernels: the build reads a copy."""
    import torch.utils.cpp_extension as cpp

    seen = {}
    monkeypatch.setenv("SITE_LENS_CACHE", str(tmp_path))
    monkeypatch.setattr(cpp, "load", lambda **kw: seen.update(kw) or "ext")
    monkeypatch.setattr(kernels, "_state", {"tried": False, "ext": None})
    assert kernels.load() == "ext"
    (src,) = map(Path, seen["sources"])
    assert src.parent == Path(seen["build_directory"]) and src.parent.is_relative_to(tmp_path)
    assert src.read_bytes() == kernels.SOURCE.read_bytes()


def test_a_build_lock_left_by_a_killed_build_does_not_hang_the_next(monkeypatch, tmp_path):
    """Builds take turns under an OS lock (released when its holder dies); holding it, torch's leftover lock goes."""
    fcntl = pytest.importorskip("fcntl")

    import torch.utils.cpp_extension as cpp

    seen = {}

    def fake_build(**kw):
        out = Path(kw["build_directory"])
        seen["torch_lock_left"] = (out / "lock").exists()
        with open(out / "build.flock", "a+") as other:  # another process's attempt while this build runs
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen["turn_held"] = False
            except BlockingIOError:
                seen["turn_held"] = True
        return "ext"

    monkeypatch.setenv("SITE_LENS_CACHE", str(tmp_path))
    monkeypatch.setattr(cpp, "load", fake_build)
    monkeypatch.setattr(kernels, "_state", {"tried": False, "ext": None})
    kernels.load()  # makes the build folder
    (folder,) = (tmp_path / "ext").iterdir()
    (folder / "lock").touch()  # a killed build's lock, fresh
    monkeypatch.setattr(kernels, "_state", {"tried": False, "ext": None})
    assert kernels.load() == "ext"
    assert seen == {"torch_lock_left": False, "turn_held": True}
    with open(folder / "build.flock", "a+") as f:  # released once the build is loaded
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_without_an_os_lock_only_an_old_torch_lock_is_taken_as_left_over(monkeypatch, tmp_path):
    """A file system without flock: the kernels still build, and torch's lock goes only once it is stale."""
    import os
    import time

    fcntl = pytest.importorskip("fcntl")

    def no_flock(*a):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    lock = tmp_path / "lock"
    lock.touch()
    assert kernels._take_turn(tmp_path) is None and lock.exists()  # fresh: another build may hold it
    old = time.time() - kernels.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    assert kernels._take_turn(tmp_path) is None and not lock.exists()
