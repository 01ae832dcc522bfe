"""merge_attn_states against a float64 reference on fresh random inputs (CPU always, GPU when present)."""
import itertools
import shutil
import subprocess

import pytest
import torch

import mla_ext
from mla_ext import reference
from conftest import DEVICES, HAS_GPU, TOL, assert_close_rel, poison_, requires_gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INF = float("inf")


def make_case(T, H, D, dtype, device, *, gen_seed=None, pad_to=None):
    """Random prefix/suffix values [T,H,D] (optionally views of [T,H,pad_to]) and LSEs."""
    g = torch.Generator().manual_seed(gen_seed if gen_seed is not None else torch.seed() % 2**31)

    def vals():
        width = pad_to or D
        full = torch.randn(T, H, width, generator=g).to(dtype).to(device)
        return full[..., :D]

    pa, pb = vals(), vals()
    la = (torch.randn(T, H, generator=g) * 3).to(device)
    lb = (torch.randn(T, H, generator=g) * 3).to(device)
    return pa, la, pb, lb


def run_and_check(out, out_lse, pa, la, pb, lb, dtype):
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
    assert_close_rel(out, ref_o, dtype)
    if out_lse is not None:
        assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5, equal_nan=True)


# A covering subset of tokens x heads x head_size x dtype (not the full product).
SHAPES = [
    (1, 1, 1), (1, 3, 5), (7, 16, 48), (7, 3, 192), (613, 3, 128), (613, 16, 5),
    (1, 128, 512), (4096, 1, 128), (4096, 16, 48), (7, 128, 1), (613, 1, 512),
    (7, 96, 512), (7, 128, 512), (7, 256, 512), (3, 5, 576), (2, 7, 2), (2, 7, 3),
    (2, 7, 4), (2, 7, 6), (2, 7, 7),
]


@pytest.mark.parametrize("T,H,D", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_contiguous(device, T, H, D, dtype):
    pa, la, pb, lb = make_case(T, H, D, dtype, device)
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    run_and_check(out, out_lse, pa, la, pb, lb, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", [(7, 16), (613, 3), (1, 128)])
def test_padded_mla_views(device, dtype, T, H):
    """Inputs are [..., :128] of [T,H,192]; output is a [T, H*128] buffer viewed at a token offset."""
    D, off = 128, 5
    pa, la, pb, lb = make_case(T, H, D, dtype, device, pad_to=192)
    buf = poison_(torch.empty(T + 2 * off, H * D, dtype=dtype, device=device))
    sentinel = buf.clone()
    out = buf[off:off + T].view(T, H, D)
    # vLLM-style [H, T] LSE buffers passed transposed.
    lse_buf = poison_(torch.empty(H, T + 3, device=device))
    out_lse = lse_buf[:, 1:T + 1].T
    run_and_check(out, out_lse, pa, la, pb, lb, dtype)
    # Nothing outside the views was written (NaN == NaN compared bitwise).
    assert torch.equal(buf[:off].view(torch.int16 if dtype != torch.float32 else torch.int32),
                       sentinel[:off].view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert torch.equal(buf[off + T:].isnan(), sentinel[off + T:].isnan())
    assert lse_buf[:, 0].isnan().all() and lse_buf[:, T + 1:].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_independent_strides(device, dtype):
    """prefix, suffix and output each with their own token and head strides."""
    T, H, D = 33, 6, 64
    g = torch.Generator().manual_seed(1)
    pa = torch.randn(H, T, D + 8, generator=g).to(dtype).to(device).transpose(0, 1)[..., :D]
    pb = torch.randn(T, 2 * H, D, generator=g).to(dtype).to(device)[:, ::2]
    la = torch.randn(H, T, generator=g).to(device).T
    lb = torch.randn(T, H, 3, generator=g).to(device)[..., 1]
    outbuf = poison_(torch.empty(T, H, 2, D, dtype=dtype, device=device))
    out = outbuf[:, :, 1]
    out_lse = poison_(torch.empty(T, H, device=device))
    run_and_check(out, out_lse, pa, la, pb, lb, dtype)
    assert outbuf[:, :, 0].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_narrow_alignment_path(device, dtype):
    """Pointers not 16-byte aligned: the kernel must fall back to narrower accesses."""
    T, H, D = 9, 4, 64
    g = torch.Generator().manual_seed(2)
    base = torch.randn(T * H * D + 1, generator=g).to(dtype).to(device)
    pa = base[1:].view(T, H, D)  # element offset 1: misaligned for any vector width
    pb = torch.randn(T, H, D, generator=g).to(dtype).to(device)
    la, lb = torch.randn(T, H, generator=g).to(device), torch.randn(T, H, generator=g).to(device)
    out = poison_(torch.empty(T * H * D + 3, dtype=dtype, device=device))[3:].view(T, H, D)
    out_lse = poison_(torch.empty(T, H, device=device))
    run_and_check(out, out_lse, pa, la, pb, lb, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_sides_and_nan(device, dtype):
    T, H, D = 8, 4, 40
    pa, la, pb, lb = make_case(T, H, D, dtype, device, gen_seed=3)
    pa, pb = pa.clone(), pb.clone()
    # token 0: prefix +inf (empty), prefix values NaN -> suffix exactly
    la[0] = INF; pa[0] = float("nan")
    # token 1: suffix -inf (empty), suffix values NaN -> prefix exactly
    lb[1] = -INF; pb[1] = float("nan")
    # token 2: both empty -> 0, -inf
    la[2] = -INF; lb[2] = INF; pa[2] = float("nan"); pb[2] = float("nan")
    # token 3: NaN LSE -> NaN
    la[3] = float("nan")
    # token 4: prefix -inf, suffix +inf (both empty)
    la[4] = -INF; lb[4] = INF
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
    assert torch.equal(out[0], pb[0]) and torch.equal(out_lse[0], lb[0])
    assert torch.equal(out[1], pa[1]) and torch.equal(out_lse[1], la[1])
    for t in (2, 4):
        assert (out[t] == 0).all() and torch.isneginf(out_lse[t]).all()
    assert out[3].isnan().all() and out_lse[3].isnan().all()
    ref_o, ref_l = reference.merge_attn_states(pa[5:].cpu(), la[5:].cpu(), pb[5:].cpu(), lb[5:].cpu())
    assert_close_rel(out[5:], ref_o, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alias", ["prefix", "suffix"])
def test_output_aliases_input(device, dtype, alias):
    T, H, D = 613, 8, 128
    pa, la, pb, lb = make_case(T, H, D, dtype, device)
    pa, pb = pa.clone(), pb.clone()
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    out = pa if alias == "prefix" else pb
    mla_ext.merge_attn_states(out, None, pa, la, pb, lb)
    assert_close_rel(out, ref_o, dtype)


def test_empty_batch(device):
    for shape in [(0, 4, 64), (4, 0, 64)]:
        z = torch.empty(*shape, dtype=torch.bfloat16, device=device)
        lse = torch.empty(shape[:2], device=device)
        mla_ext.merge_attn_states(z, lse, z, lse, z, lse)


def test_lse_optional_and_vllm_compat(device):
    T, H, D = 17, 16, 512
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device=device))
    # vLLM layout: LSE [num_heads, num_tokens]
    la_v, lb_v = la.T.contiguous(), lb.T.contiguous()
    out_lse_v = poison_(torch.empty(H, T, device=device))
    mla_ext.compat.vllm.merge_attn_states(out, pa, la_v, pb, lb_v, output_lse=out_lse_v)
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    assert_close_rel(out, ref_o, torch.bfloat16)
    assert torch.allclose(out_lse_v.T.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


# ---- errors: raised before anything is written ----

def _valid(device, T=4, H=3, D=16, dtype=torch.bfloat16):
    pa, la, pb, lb = make_case(T, H, D, dtype, device, gen_seed=4)
    out = poison_(torch.empty(T, H, D, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(T, H, device=device))
    return dict(output=out, output_lse=out_lse, prefix_output=pa, prefix_lse=la,
                suffix_output=pb, suffix_lse=lb)


ERROR_CASES = {
    "value dtypes differ": (lambda a: a.update(suffix_output=a["suffix_output"].float()), "suffix_output"),
    "value dtype unsupported": (lambda a: a.update(output=a["output"].double(), prefix_output=a["prefix_output"].double(),
                                                   suffix_output=a["suffix_output"].double()), "float32, float16 or bfloat16"),
    "lse not fp32": (lambda a: a.update(prefix_lse=a["prefix_lse"].double()), "prefix_lse"),
    "shape mismatch": (lambda a: a.update(suffix_output=a["suffix_output"][:, :2]), "suffix_output"),
    "lse shape": (lambda a: a.update(suffix_lse=a["suffix_lse"][:2]), "suffix_lse"),
    "output_lse shape": (lambda a: a.update(output_lse=poison_(torch.empty(3, 4, device=a["output"].device))), "output_lse"),
    "last dim not contiguous": (lambda a: a.update(prefix_output=torch.randn(4, 3, 32, device=a["output"].device).to(torch.bfloat16)[..., ::2]), "prefix_output"),
    "output not 3-D": (lambda a: a.update(output=a["output"].flatten(1)), "output"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_before_write(device, case):
    args = _valid(device)
    mutate, needle = ERROR_CASES[case]
    mutate(args)
    out, out_lse = args["output"], args["output_lse"]
    before = (out.clone(), out_lse.clone())
    with pytest.raises(RuntimeError, match=needle):
        mla_ext.merge_attn_states(**args)
    assert torch.equal(out.isnan(), before[0].isnan()) and out.isnan().all()
    assert out_lse.isnan().all()


@requires_gpu
def test_error_mixed_devices():
    args = _valid("cuda")
    args["suffix_lse"] = args["suffix_lse"].cpu()
    with pytest.raises(RuntimeError, match="suffix_lse.*same device"):
        mla_ext.merge_attn_states(**args)
    assert args["output"].isnan().all()


# ---- torch integration ----

def test_opcheck(device):
    args = _valid(device, T=5, H=4, D=64)
    torch.library.opcheck(torch.ops.mla_ext.merge_attn_states.default, tuple(args.values()))


def test_torch_compile_fullgraph(device):
    T, H, D = 9, 4, 64
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device, gen_seed=5)

    @torch.compile(fullgraph=True)
    def f(pa, la, pb, lb):
        out = torch.empty_like(pa)
        out_lse = torch.empty_like(la)
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
        return out * 2, out_lse

    out, out_lse = f(pa, la, pb, lb)
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    assert_close_rel(out / 2, ref_o, torch.bfloat16)


def test_stable_abi_symbols():
    """The built library references no mangled at::/c10:: C++ symbols (LibTorch stable ABI only)."""
    nm, cxxfilt = shutil.which("nm"), shutil.which("c++filt")
    if not (nm and cxxfilt):
        pytest.skip("nm/c++filt not available")
    syms = subprocess.run([nm, "-D", "--undefined-only", mla_ext._LIBRARY_PATH], check=True,
                          capture_output=True, text=True).stdout
    demangled = subprocess.run([cxxfilt], input=syms, check=True, capture_output=True, text=True).stdout
    bad = [line for line in demangled.splitlines() if "at::" in line or "c10::" in line]
    assert not bad, "non-stable torch symbols referenced:\n" + "\n".join(bad[:20])
    assert "aoti_torch" in syms or "torch_" in syms  # it does use the stable C shim


# ---- GPU only ----

@requires_gpu
def test_cuda_graph_capture_side_stream_replay():
    T, H, D = 64, 16, 512
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cuda")
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda"))
    out_lse = poison_(torch.empty(T, H, device="cuda"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)  # warm-up
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        mla_ext.merge_attn_states(out, out_lse, pa, la, pb, lb)
    for _ in range(2):
        n = make_case(T, H, D, torch.bfloat16, "cuda")
        for dst, src in zip((pa, la, pb, lb), n):
            dst.copy_(src)
        poison_(out); poison_(out_lse)
        g.replay()
        torch.cuda.synchronize()
        ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
        assert_close_rel(out, ref_o, torch.bfloat16)
        assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5)


@requires_gpu
def test_offsets_past_2_pow_32():
    """Element offsets beyond 2^32 (64-bit indexing): a huge token stride on the output."""
    T, H, D = 3, 2, 64
    stride_t = (1 << 31) + 64  # elements; token 2 starts past 2^32
    if torch.cuda.get_device_properties(0).total_memory < 12 * (1 << 30):
        pytest.skip("needs ~9 GiB of device memory")
    big = torch.empty(stride_t * (T - 1) + H * D, dtype=torch.bfloat16, device="cuda")
    out = big.as_strided((T, H, D), (stride_t, D, 1))
    out.fill_(float("nan"))
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cuda")
    out_lse = poison_(torch.empty(T, H, device="cuda"))
    run_and_check(out, out_lse, pa, la, pb, lb, torch.bfloat16)
    del big
    torch.cuda.empty_cache()


def test_meta_and_real_tensors_mixed_raise():
    """A meta tensor among real ones dispatches to the fake implementation: it must raise too."""
    args = _valid("cpu")
    args["suffix_output"] = args["suffix_output"].to("meta")
    with pytest.raises(RuntimeError, match="suffix_output.*same device"):
        mla_ext.merge_attn_states(**args)


def test_vllm_compat_lse_shape_message():
    T, H, D = 5, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cpu", gen_seed=6)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"prefix_lse of shape \[num_heads, num_tokens\] = \[3, 5\]"):
        mla_ext.compat.vllm.merge_attn_states(out, pa, la, pb, lb.T)  # prefix_lse given as [T, H]
    assert out.isnan().all()
