"""mla_ext.compat.sglang (SGLang's ``merge_state`` / ``sgl_kernel.merge_state_v2`` call shapes:
LSE ``[num_tokens, num_heads]``, optional outputs allocated, ``(output, output_lse)`` returned)
against the float64 reference on fresh random inputs (CPU always, GPU when present)."""
import pytest
import torch

from mla_ext import reference
from mla_ext.compat import sglang
from conftest import assert_close_rel, make_merge_case, poison_

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
INF = float("inf")


def make_case(T, H, D, dtype, device, seed, pad_to=None):
    """Prefix / suffix values [T, H, D] (views of [T, H, pad_to] when given) and [T, H] LSEs."""
    return make_merge_case(T, H, D, dtype, device, gen_seed=seed, pad_to=pad_to)


def check(out, out_lse, pa, la, pb, lb, dtype):
    ref_o, ref_l = reference.merge_attn_states(pa.cpu(), la.cpu(), pb.cpu(), lb.cpu())
    magnitude, _ = reference.merge_attn_states(pa.cpu().abs(), la.cpu(), pb.cpu().abs(), lb.cpu())
    assert out.shape == ref_o.shape and out_lse.shape == ref_l.shape
    assert_close_rel(out, ref_o, dtype, magnitude=magnitude)
    assert torch.allclose(out_lse.double().cpu(), ref_l, rtol=1e-6, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H,D", [(1, 128, 512), (7, 16, 128), (613, 3, 48)])
def test_allocates_what_is_not_given(device, dtype, T, H, D):
    """No outputs passed: both allocated (the value dtype and float32), written and returned."""
    pa, la, pb, lb = make_case(T, H, D, dtype, device, seed=T * 1000 + H + D)
    out, out_lse = sglang.merge_state(pa, la, pb, lb)
    assert out.dtype == dtype and out_lse.dtype == torch.float32
    assert out.device == pa.device and out_lse.device == pa.device
    check(out, out_lse, pa, la, pb, lb, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_writes_the_callers_strided_buffers(device, dtype):
    """Outputs passed: the very tensors are written and returned. Inputs are [..., :128] views of
    [T, H, 192] (the padded MLA values), output a token-offset view of a [T', H * 128] buffer, the
    output LSE a column block of a wider buffer; nothing outside the views changes."""
    T, H, D, off = 9, 16, 128, 3
    pa, la, pb, lb = make_case(T, H, D, dtype, device, seed=42, pad_to=192)
    buf = poison_(torch.empty(T + 2 * off, H * D, dtype=dtype, device=device))
    out = buf[off:off + T].view(T, H, D)
    lse_buf = poison_(torch.empty(T, H + 4, device=device))
    out_lse = lse_buf[:, 2:H + 2]
    got_o, got_l = sglang.merge_state(pa, la, pb, lb, out, out_lse)
    assert got_o is out and got_l is out_lse
    check(out, out_lse, pa, la, pb, lb, dtype)
    assert buf[:off].isnan().all() and buf[off + T:].isnan().all()
    assert lse_buf[:, :2].isnan().all() and lse_buf[:, H + 2:].isnan().all()


def test_v2_names(device):
    """merge_state_v2 takes sgl_kernel's names (v_a, s_a, v_b, s_b, v_merged, s_merged)."""
    T, H, D = 5, 8, 64
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device, seed=7)
    v = poison_(torch.empty(T, H, D, dtype=torch.bfloat16, device=device))
    s = poison_(torch.empty(T, H, device=device))
    got_v, got_s = sglang.merge_state_v2(v_a=pa, s_a=la, v_b=pb, s_b=lb, v_merged=v, s_merged=s)
    assert got_v is v and got_s is s
    check(v, s, pa, la, pb, lb, torch.bfloat16)
    # Only the LSE output given: the values are allocated.
    s2 = poison_(torch.empty(T, H, device=device))
    got_v2, got_s2 = sglang.merge_state_v2(pa, la, pb, lb, s_merged=s2)
    assert got_s2 is s2 and torch.equal(got_v2, v) and torch.equal(s2, s)


@pytest.mark.parametrize("lse_dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_lse_cast_to_float32(device, lse_dtype):
    """Non-float32 floating LSEs are cast to float32 first (as SGLang's wrappers do): the result
    equals the call with the cast LSEs, and the caller's LSE tensors are untouched."""
    T, H, D = 6, 4, 32
    pa, la, pb, lb = make_case(T, H, D, torch.float32, device, seed=11)
    la_x, lb_x = la.to(lse_dtype), lb.to(lse_dtype)
    keep = la_x.clone(), lb_x.clone()
    out, out_lse = sglang.merge_state(pa, la_x, pb, lb_x)
    ref_out, ref_lse = sglang.merge_state(pa, la_x.float(), pb, lb_x.float())
    assert torch.equal(out, ref_out) and torch.equal(out_lse, ref_lse)
    assert la_x.dtype == lse_dtype and torch.equal(la_x, keep[0]) and torch.equal(lb_x, keep[1])
    check(out, out_lse, pa, la_x.float(), pb, lb_x.float(), torch.float32)


def test_empty_sides_and_in_place(device):
    """+inf or -inf on one side selects the other side (its NaN values never read into the
    result), both sides empty give output 0 and LSE -inf, and output may be prefix_output."""
    T, H, D = 4, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.float32, device, seed=5)
    la[0], lb[1] = INF, -INF            # token 0: prefix empty; token 1: suffix empty
    pa[0] = float("nan")
    pb[1] = float("nan")
    la[2], lb[2] = -INF, -INF           # token 2: both empty
    want_o = torch.stack([pb[0], pa[1], torch.zeros_like(pa[2]), pa[3]])
    want_l = torch.stack([lb[0], la[1], torch.full_like(la[2], -INF), torch.logaddexp(la[3], lb[3])])
    pa_ref, pb_ref, la_ref, lb_ref = pa.clone(), pb.clone(), la.clone(), lb.clone()
    out, out_lse = sglang.merge_state(pa, la, pb, lb, output=pa)  # in place into the prefix
    assert out is pa
    torch.testing.assert_close(out[:3], want_o[:3], rtol=0, atol=0)
    torch.testing.assert_close(out_lse[:3], want_l[:3], rtol=0, atol=0)
    check(out[3:], out_lse[3:], pa_ref[3:], la_ref[3:], pb_ref[3:], lb_ref[3:], torch.float32)


@pytest.mark.parametrize("name", ["prefix_output", "prefix_lse", "suffix_output", "suffix_lse"])
def test_non_tensor_named(name):
    """A None / non-tensor required argument is named in a TypeError, whether the wrapper met it
    while allocating the outputs or the op did."""
    T, H, D = 5, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cpu", seed=6)
    args = dict(prefix_output=pa, prefix_lse=la, suffix_output=pb, suffix_lse=lb)
    args[name] = None
    with pytest.raises(TypeError, match=f"expected {name} to be a torch.Tensor, got NoneType"):
        sglang.merge_state(**args)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16))
    lse = poison_(torch.empty(T, H))
    with pytest.raises(TypeError, match=f"expected {name} to be a torch.Tensor, got NoneType"):
        sglang.merge_state(**args, output=out, output_lse=lse)
    assert out.isnan().all() and lse.isnan().all()


def test_vllm_layout_refused_nothing_written():
    """An LSE in vLLM's [num_heads, num_tokens] layout is refused by shape before any write."""
    T, H, D = 5, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, "cpu", seed=8)
    out = poison_(torch.empty(T, H, D, dtype=torch.bfloat16))
    lse = poison_(torch.empty(T, H))
    with pytest.raises(RuntimeError, match="prefix_lse"):
        sglang.merge_state(pa, la.T.contiguous(), pb, lb, out, lse)
    assert out.isnan().all() and lse.isnan().all()


def test_torch_compile_fullgraph(device):
    """The allocating form traces into one graph (the allocations and the op) and gives the eager
    result."""
    T, H, D = 7, 16, 128
    pa, la, pb, lb = make_case(T, H, D, torch.bfloat16, device, seed=31)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def fn(a, la_, b, lb_):
        return sglang.merge_state(a, la_, b, lb_)

    out, out_lse = fn(pa, la, pb, lb)
    want, want_lse = sglang.merge_state(pa, la, pb, lb)
    assert torch.equal(out, want) and torch.equal(out_lse, want_lse)
    check(out, out_lse, pa, la, pb, lb, torch.bfloat16)


def test_errors_on_allocated_outputs_say_where_they_came_from():
    """A check that fails on an output this wrapper allocated (the op names it ``output`` /
    ``output_lse``) says which input it was made from; nothing the caller passed is written."""
    T, H, D = 5, 3, 16
    pa, la, pb, lb = make_case(T, H, D, torch.float32, "cpu", seed=9)
    with pytest.raises(RuntimeError, match=r"expected output to be float32.*\n.*allocated output as "
                                           r"torch\.empty_like\(prefix_output\)"):
        sglang.merge_state(pa.double(), la, pb, lb)
    lse = poison_(torch.empty(T, H))
    with pytest.raises(RuntimeError, match=r"output and suffix_output to have the same shape.*\n.*about "
                                           r"prefix_output / prefix_lse"):
        sglang.merge_state(pa[:4], la[:4], pb, lb, output_lse=lse)
    assert lse.isnan().all()
    out = poison_(torch.empty(T, H, D))
    with pytest.raises(RuntimeError, match=r"output_lse on the same device as output.*\n.*allocated output_lse as"):
        sglang.merge_state(pa, la.to("meta"), pb, lb, output=out)
    assert out.isnan().all()


def test_allocated_lse_takes_the_prefix_lse_strides():
    """As SGLang's ``torch.empty_like(s_a)``: a token-stride-1 prefix LSE (a transposed view)
    gives an output LSE with the same strides."""
    T, H, D = 6, 5, 32
    pa, la, pb, lb = make_case(T, H, D, torch.float32, "cpu", seed=12)
    la_t = la.T.contiguous().T
    out, out_lse = sglang.merge_state(pa, la_t, pb, lb)
    assert out_lse.stride() == la_t.stride() == (1, T)
    check(out, out_lse, pa, la, pb, lb, torch.float32)
