"""Tests of mla_ext.formats: DeepSeek V3.2 / V4 KV cache byte layouts (CPU, pure PyTorch)."""

import re
import struct

import pytest
import torch

import mla_ext.formats as F
from conftest import e4m3_reference_table

FP8_FORMATS = ["fp8_ds_mla", "fp8_ds_mla_v4", "fp8_ds_mla_fnuz", "fp8_ds_mla_v4_fnuz"]


def _kv(shape, seed, outliers=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if outliers:
        flat = x.view(-1, shape[-1])
        pos = torch.randint(0, shape[-1], (flat.shape[0], 3), generator=g)
        flat.scatter_(1, pos, flat.gather(1, pos) * 40.0)
    return x


# ---------------------------------------------------------------------------------------------
# UE8M0
# ---------------------------------------------------------------------------------------------


def test_ue8m0_special_bytes_exact():
    b = torch.tensor([0, 1, 127, 254, 255], dtype=torch.uint8)
    f = F.ue8m0_to_float(b)
    assert f.dtype == torch.float32
    bits = f.view(torch.int32)
    assert int(bits[0]) == 1 << 22  # denormal 2^-127, not flushed to zero
    assert f[0].item() != 0.0
    assert f.double()[0].item() == 2.0 ** -127
    assert f.double()[1].item() == 2.0 ** -126
    assert f[2].item() == 1.0
    assert f.double()[3].item() == 2.0 ** 127
    assert torch.isnan(f[4])


def test_ue8m0_all_bytes():
    b = torch.arange(0, 255, dtype=torch.uint8)
    f = F.ue8m0_to_float(b).double()
    expect = torch.tensor([2.0 ** (int(v) - 127) for v in range(255)], dtype=torch.float64)
    assert torch.equal(f, expect)


def test_float_to_ue8m0_exponent_exact_at_powers_of_two():
    x = torch.tensor([1.0, 2.0, 0.5, 2.0 ** -20, 3.0, 1.0000001, 0.75, 448.0 / 448.0])
    e = F.float_to_ue8m0_exponent(x)
    assert e.tolist() == [0, 1, -1, -20, 2, 1, 0, 0]
    # property: 2^(e-1) < x <= 2^e
    g = torch.Generator().manual_seed(1)
    y = torch.rand(1000, generator=g, dtype=torch.float64) * 1e3 + 1e-6
    ey = F.float_to_ue8m0_exponent(y).double()
    assert bool((2.0 ** ey >= y).all()) and bool((2.0 ** (ey - 1) < y).all())


# ---------------------------------------------------------------------------------------------
# error bounds
# ---------------------------------------------------------------------------------------------
#
# e4m3fn has 3 mantissa bits: for a scaled value v with |v| >= 2^-6 (normal), round-to-nearest
# error <= 2^(k-4) <= |v|/16 where 2^k <= |v|; subnormals have spacing 2^-9, error <= 2^-10.
# |v| <= 448 always (amax/scale <= 448, then clamp). In original units (x = v * scale):
#     |x_hat - x| <= max(|x| / 16, scale * 2^-10)  (+ fp32 rounding of x/scale, |x| * 2^-24)
# e4m3fnuz: the same with max 240 and subnormal spacing 2^-10 (error <= 2^-11).
# bf16 (8 significant bits): |x_hat - x| <= |x| * 2^-8.


def _fp8_bound(x, scale, fnuz=False):
    return torch.maximum(x.abs() / 16, scale * 2.0 ** (-11 if fnuz else -10)) + x.abs() * 2.0 ** -22


def _check_v32_rows(x, x_hat, fnuz=False):
    n = x.shape[0]
    lat = x[:, :512].double().reshape(n, 4, 128)
    amax = lat.abs().amax(-1).clamp_min(1e-4)
    scale = (amax / (240.0 if fnuz else 448.0)).unsqueeze(-1)
    err = (x_hat[:, :512].reshape(n, 4, 128) - lat).abs()
    bound = _fp8_bound(lat, scale, fnuz)
    assert bool((err <= bound).all()), float((err - bound).max())
    rope = x[:, 512:].double()
    assert bool(((x_hat[:, 512:] - rope).abs() <= rope.abs() * 2.0 ** -8).all())


def _check_v4_rows(x, x_hat, scale_bytes, fnuz=False):
    n = x.shape[0]
    fmax = 240.0 if fnuz else 448.0
    nope = x[:, :448].double().reshape(n, 7, 64)
    amax = nope.abs().amax(-1).clamp_min(1e-4)
    scale = F.ue8m0_to_float(scale_bytes[:, :7]).double()  # 2^e
    # e = ceil(log2(amax / M)): amax/M <= 2^e < 2 * amax/M  (M = 448 e4m3fn, 240 e4m3fnuz)
    assert bool((scale >= amax / fmax).all()) and bool((scale < 2 * amax / fmax).all())
    err = (x_hat[:, :448].reshape(n, 7, 64) - nope).abs()
    bound = _fp8_bound(nope, scale.unsqueeze(-1), fnuz)
    assert bool((err <= bound).all()), float((err - bound).max())
    rope = x[:, 448:].double()
    assert bool(((x_hat[:, 448:] - rope).abs() <= rope.abs() * 2.0 ** -8).all())


def _special_tiles_v32(kv):
    kv[0, 0, :128] = torch.linspace(-1e-6, 1e-6, 128)  # amax below the 1e-4 floor
    kv[0, 1, 128:256] = 0.0  # all-zero tile
    kv[0, 2, 256:384] *= 1e4  # huge tile
    kv[0, 3, 384:512] = 3e-5  # constant tiny tile
    return kv


@pytest.mark.parametrize("fnuz", [False, True])
def test_v32_roundtrip_error_bound(fnuz):
    fmt = "fp8_ds_mla_fnuz" if fnuz else "fp8_ds_mla"
    kv = _special_tiles_v32(_kv((3, 16, 576), seed=0))
    cache = F.pack_fp8_ds_mla(kv, fnuz=fnuz)
    assert cache.shape == (3, 16, 656) and cache.dtype == torch.uint8 and cache.is_contiguous()
    assert torch.equal(cache, F.pack_kv_cache(kv, fmt))
    x_hat = F.unpack_kv_cache(cache, fmt, dtype=torch.float64)
    assert x_hat.shape == (3, 16, 576)
    _check_v32_rows(kv.reshape(-1, 576), x_hat.reshape(-1, 576), fnuz)
    assert torch.equal(x_hat[0, 1, 128:256], torch.zeros(128, dtype=torch.float64))
    # float32 result agrees with the float64 one to fp32 rounding
    x32 = F.unpack_kv_cache(cache, fmt)
    assert x32.dtype == torch.float32
    torch.testing.assert_close(x32.double(), x_hat, rtol=2 ** -23, atol=0)
    # not trivially exact: quantisation did happen
    assert float((x_hat - kv.double()).abs().max()) > 0


@pytest.mark.parametrize("fnuz", [False, True])
def test_v4_roundtrip_error_bound(fnuz):
    fmt = "fp8_ds_mla_v4_fnuz" if fnuz else "fp8_ds_mla_v4"
    kv = _kv((3, 16, 512), seed=1)
    kv[0, 0, :64] = torch.linspace(-1e-6, 1e-6, 64)
    kv[0, 1, 64:128] = 0.0
    kv[0, 2, 128:192] *= 1e4
    kv[0, 3, 384:448] = 3e-5
    cache = F.pack_fp8_ds_mla_v4(kv, fnuz=fnuz)
    assert cache.shape == (3, 16, 584) and cache.dtype == torch.uint8
    x_hat = F.unpack_kv_cache(cache, fmt, dtype=torch.float64)
    _, scales = F._v4_views(cache)
    _check_v4_rows(kv.reshape(-1, 512), x_hat.reshape(-1, 512), scales.reshape(-1, 8), fnuz)
    assert torch.equal(x_hat[0, 1, 64:128], torch.zeros(64, dtype=torch.float64))
    # power-of-two scales: float32 dequantisation is exact
    assert torch.equal(F.unpack_kv_cache(cache, fmt).double(), x_hat)
    assert not torch.isnan(x_hat).any()


def test_bf16_dispatch():
    kv = _kv((2, 4, 512), seed=2)
    c = F.pack_kv_cache(kv, "bf16")
    assert c.dtype == torch.bfloat16 and c.shape == (2, 4, 512)
    assert torch.equal(F.unpack_kv_cache(c, "bf16"), kv.to(torch.bfloat16).float())
    assert torch.equal(F.pack_kv_cache(_kv((2, 4, 576), 3), "fp8_ds_mla"),
                       F.pack_fp8_ds_mla(_kv((2, 4, 576), 3)))
    with pytest.raises(ValueError):
        F.pack_kv_cache(kv, "fp8_fnuz")


@pytest.mark.parametrize("call,exc,words", [
    (lambda: F.kv_bytes_per_row("bf16", 100), ValueError, "expected d_qk 576 (V3.2) or 512 (V4)"),
    (lambda: F.kv_bytes_per_row("fp8_ds_mla_v4", 576), ValueError, "kv_format 'fp8_ds_mla_v4' has d_qk 512, got 576"),
    (lambda: F.kv_bytes_per_row("bf16", "576"), TypeError, "expected d_qk to be an integer"),
    (lambda: F.alloc_kv_cache("fp8_ds_mla", 1, 1, d_qk=576.0), TypeError, "expected d_qk to be an integer, got 576.0"),
    (lambda: F.write_kv_rows(F.alloc_kv_cache("bf16", 2, 4, 512), "bf16", [0, 1], torch.randn(2, 512)), ValueError,
     "slots: expected an integer tensor [n], got list"),
    (lambda: F.write_kv_rows(F.alloc_kv_cache("bf16", 2, 4, 512), "bf16", torch.tensor([0, 1]),
                             torch.ones(2, 512, dtype=torch.int32)), ValueError,
     "kv: expected a floating-point (float32 / bfloat16) tensor [n, 512], got torch.int32"),
])
def test_format_helpers_refuse_bad_arguments(call, exc, words):
    """Widths that do not match the format, non-integer widths, and slots / rows that are not
    tensors of the right kind: refused naming the argument (write_kv_rows: before any write)."""
    with pytest.raises(exc, match=re.escape(words)):
        call()


def test_bytes_per_row():
    assert F.kv_bytes_per_row("bf16", 576) == 1152
    assert F.kv_bytes_per_row("bf16", 512) == 1024
    assert F.kv_bytes_per_row("fp8_ds_mla") == 656
    assert F.kv_bytes_per_row("fp8_ds_mla_v4", 512) == 584
    assert F.kv_bytes_per_row("fp8_ds_mla_fnuz") == 656
    assert F.kv_bytes_per_row("fp8_ds_mla_v4_fnuz") == 584
    assert F.D_QK == {"bf16": None, "fp8_ds_mla": 576, "fp8_ds_mla_v4": 512, "fp8_ds_mla_fnuz": 576,
                      "fp8_ds_mla_v4_fnuz": 512}
    assert F.ROW_BYTES == {"fp8_ds_mla": 656, "fp8_ds_mla_v4": 584, "fp8_ds_mla_fnuz": 656,
                           "fp8_ds_mla_v4_fnuz": 584}


# ---------------------------------------------------------------------------------------------
# hand-computed byte layouts
# ---------------------------------------------------------------------------------------------


def test_v32_byte_layout_by_hand():
    kv = torch.zeros(2, 3, 576)
    n, p = 1, 2
    kv[n, p, 0] = 448.0  # tile 0 amax 448 -> scale 1.0
    kv[n, p, 1] = 1.5  # e4m3fn 1.5 = 0x3C
    kv[n, p, 128] = -2.0  # tile 1 amax 2 -> scale 2/448, stored -448 = 0xFE
    kv[n, p, 512] = 1.0  # RoPE bf16 1.0 = 0x3F80 -> bytes 80 3F
    kv[n, p, 575] = -2.0  # bf16 -2.0 = 0xC000 -> bytes 00 C0
    row = F.pack_fp8_ds_mla(kv)[n, p].tolist()
    assert row[0] == 0x7E and row[1] == 0x3C  # 448 = 0x7E in e4m3fn
    assert row[128] == 0xFE
    assert bytes(row[512:516]) == struct.pack("<f", 1.0)
    assert bytes(row[516:520]) == struct.pack("<f", struct.unpack("<f", struct.pack("<f", 2.0 / 448.0))[0])
    assert bytes(row[520:524]) == struct.pack("<f", 1e-4 / 448.0)  # zero tile: amax floor
    assert row[528:530] == [0x80, 0x3F]
    assert row[654:656] == [0x00, 0xC0]


def test_v4_byte_layout_by_hand():
    page_size = 4
    kv = torch.zeros(3, page_size, 512)
    n, p = 2, 1
    kv[n, p, 0] = 448.0  # tile 0: amax 448 -> e = 0 -> byte 127, stored 448 = 0x7E
    kv[n, p, 1] = 1.5  # 0x3C
    kv[n, p, 64] = 1.0  # tile 1: amax 1 -> e = ceil(log2(1/448)) = -8 -> byte 119, 1*2^8 = 256 = 0x78
    kv[n, p, 448] = 1.0  # bf16 RoPE
    kv[n, p, 511] = -2.0
    cache = F.pack_fp8_ds_mla_v4(kv)
    ps = F.default_v4_page_stride(page_size)
    assert ps == 2880 and cache.stride() == (ps, 584, 1)
    buf = cache.as_strided((3 * ps,), (1,), 0).tolist()
    data = n * ps + p * 576
    assert buf[data] == 0x7E and buf[data + 1] == 0x3C
    assert buf[data + 64] == 0x78
    assert buf[data + 448:data + 450] == [0x80, 0x3F]
    assert buf[data + 574:data + 576] == [0x00, 0xC0]
    sc = n * ps + page_size * 576 + p * 8
    # zero tiles: amax 1e-4 -> e = ceil(log2(1e-4/448)) = -22 -> byte 105
    assert buf[sc:sc + 8] == [127, 119, 105, 105, 105, 105, 105, 0]
    # padding between pages is garbage 0xFF, never data
    for m in range(3):
        assert set(buf[m * ps + page_size * 584:(m + 1) * ps]) == {0xFF}


# ---------------------------------------------------------------------------------------------
# V4 page stride
# ---------------------------------------------------------------------------------------------


def test_v4_default_page_strides():
    assert F.default_v4_page_stride(256) == 149760
    assert F.default_v4_page_stride(64) == 37440
    assert F.default_v4_page_stride(2) == 1728
    assert F.default_v4_page_stride(72) == 72 * 584  # 42048 = 73 * 576, already a multiple
    c = F.pack_fp8_ds_mla_v4(_kv((2, 64, 512), seed=4))
    assert c.stride() == (37440, 584, 1)
    assert c.untyped_storage().nbytes() == 2 * 37440


def test_v4_custom_stride_same_values():
    kv = _kv((3, 8, 512), seed=5)
    a = F.pack_fp8_ds_mla_v4(kv)
    b = F.pack_fp8_ds_mla_v4(kv, page_stride=8 * 584 + 1000)  # odd, padded stride
    assert b.stride(0) == 8 * 584 + 1000
    exact = F.pack_fp8_ds_mla_v4(kv, page_stride=8 * 584)  # no padding at all
    ua = F.unpack_kv_cache(a, "fp8_ds_mla_v4")
    assert torch.equal(ua, F.unpack_kv_cache(b, "fp8_ds_mla_v4"))
    assert torch.equal(ua, F.unpack_kv_cache(exact, "fp8_ds_mla_v4"))


@pytest.mark.parametrize("kwargs,err,needle", [
    (dict(kv_format="bf16", num_pages=2, page_size=4, d_qk=100), ValueError, "d_qk 576 .* or 512"),
    (dict(kv_format="bf16", num_pages=2, page_size=4, d_qk=512.0), TypeError, "d_qk to be an integer"),
    (dict(kv_format="fp8_ds_mla_v4", num_pages=2, page_size=4, page_stride=2400.7), TypeError,
     "page_stride to be an integer"),
    (dict(kv_format="fp8_ds_mla_v4", num_pages=2, page_size=4, page_stride=torch.tensor(2400)), TypeError,
     "page_stride to be an integer, got a tensor"),
    (dict(kv_format="fp8_ds_mla", num_pages=-1, page_size=4), ValueError, "num_pages >= 0 and page_size >= 1"),
    (dict(kv_format="fp8_ds_mla", num_pages=2, page_size=0), ValueError, "num_pages >= 0 and page_size >= 1"),
    (dict(kv_format="fp8_ds_mla", num_pages=2, page_size=True), TypeError, "page_size to be an integer"),
    (dict(kv_format="fp8_ds_mla", num_pages=2, page_size=16, page_stride=12345), ValueError,
     "page_stride applies to the V4 layouts"),
    (dict(kv_format="bf16", num_pages=2, page_size=16, d_qk=576, page_stride=12345), ValueError,
     "page_stride applies to the V4 layouts"),
    (dict(kv_format="fp8_ds_mla_v4", num_pages=2, page_size=4, page_stride=100), ValueError,
     "alloc_kv_cache: page_stride must be >= page_size\\*584")])
def test_alloc_kv_cache_refuses(kwargs, err, needle):
    with pytest.raises(err, match=needle):
        F.alloc_kv_cache(kwargs.pop("kv_format"), kwargs.pop("num_pages"), kwargs.pop("page_size"), **kwargs)


@pytest.mark.parametrize("fmt", F.KV_FORMATS)
def test_pack_kv_cache_refuses_empty_pages_and_foreign_page_stride(fmt):
    """Every format refuses page_size 0 (as the decode op does) and a page_stride it has no use for."""
    d = 512 if "v4" in fmt else 576
    with pytest.raises(ValueError, match=r"kv: expected \[num_pages, page_size >= 1, "):
        F.pack_kv_cache(torch.randn(2, 0, d), fmt)
    if "v4" in fmt:
        assert F.pack_kv_cache(torch.randn(2, 4, d), fmt, page_stride=4 * 584 + 16).stride(0) == 4 * 584 + 16
    else:
        with pytest.raises(ValueError, match="pack_kv_cache: page_stride applies to the V4 layouts"):
            F.pack_kv_cache(torch.randn(2, 4, d), fmt, page_stride=12345)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla_v4", "fp8_ds_mla_v4_fnuz"])
def test_pack_errors_name_the_function_called(fmt):
    """A bad page_stride given to a packer is named with that packer, not alloc_kv_cache (which
    the caller never called)."""
    kv = torch.randn(2, 4, 512)
    fnuz = fmt.endswith("_fnuz")
    for call, fn in ((lambda **k: F.pack_kv_cache(kv, fmt, **k), "pack_kv_cache"),
                     (lambda **k: F.pack_fp8_ds_mla_v4(kv, fnuz=fnuz, **k), "pack_fp8_ds_mla_v4")):
        with pytest.raises(ValueError, match=fn + r": page_stride must be >= page_size\*584 = 2336 bytes, got 100"):
            call(page_stride=100)
        with pytest.raises(TypeError, match=fn + ": expected page_stride to be an integer, got 2400.0"):
            call(page_stride=2400.0)


def test_small_helpers_refuse_out_of_domain_arguments():
    with pytest.raises(ValueError, match="page_size >= 1, got -1"):
        F.default_v4_page_stride(-1)
    with pytest.raises(TypeError, match="page_size to be an integer, got 2.5"):
        F.default_v4_page_stride(2.5)
    assert F.default_v4_page_stride(64) == 37440  # 64 * 584 = 37376 -> 65 * 576
    with pytest.raises(ValueError, match="integer tensor of bytes, got torch.float32"):
        F.ue8m0_to_float(torch.tensor([127.9]))
    assert F.ue8m0_to_float(torch.tensor([127, 383], dtype=torch.int32)).tolist() == [1.0, 1.0]  # low 8 bits


@pytest.mark.parametrize("fmt,d_qk", [("bf16", 576), ("bf16", 512), ("fp8_ds_mla", 576), ("fp8_ds_mla_v4", 512),
                                       ("fp8_ds_mla_fnuz", 576), ("fp8_ds_mla_v4_fnuz", 512)])
@pytest.mark.parametrize("bad", ["int32", "bool", "list"])
def test_pack_kv_cache_refuses_non_float_input_in_every_format(fmt, d_qk, bad):
    """Every format's packer takes only floating-point tensors (bf16 cast int32 and bool, V3.2
    quantised them; V4 alone refused), and names kv for a non-tensor (not an AttributeError)."""
    kv = {"int32": torch.full((1, 2, d_qk), 3, dtype=torch.int32), "bool": torch.ones(1, 2, d_qk, dtype=torch.bool),
          "list": [[1.0] * d_qk]}[bad]
    got = "list" if bad == "list" else f"torch.{bad}"
    with pytest.raises(ValueError, match=rf"kv: expected a floating-point \(float32 / bfloat16\) tensor .*got {got}"):
        F.pack_kv_cache(kv, fmt)


def test_packers_and_writers_refuse_what_the_op_refuses():
    """A bf16 width other than 576 / 512, and a V4 view whose token stride is not 584 bytes, are
    refused by the packers and writers as by sparse_mla_decode, not packed into a cache it refuses."""
    with pytest.raises(ValueError, match=r"kv: expected \[num_pages, page_size >= 1, 576 or 512\], got \(2, 4, 100\)"):
        F.pack_kv_cache(torch.randn(2, 4, 100), "bf16")
    cache = F.alloc_kv_cache("fp8_ds_mla_v4", 3, 4)
    view = cache.as_strided((2, 4, 584), (2400, 600, 1), 0)
    with pytest.raises(ValueError, match=r"token stride \(stride\(1\)\) must be 584 bytes"):
        F.write_kv_rows(view, "fp8_ds_mla_v4", torch.tensor([0]), torch.randn(1, 512))
    with pytest.raises(ValueError, match="token stride"):
        F.unpack_kv_cache(view, "fp8_ds_mla_v4")
    # slots are [n]: a 2-D or 0-D tensor is refused, not flattened
    c = F.alloc_kv_cache("fp8_ds_mla", 2, 4)
    for bad in (torch.tensor([[0, 1]]), torch.tensor(0)):
        with pytest.raises(ValueError, match=r"slots: expected a 1-D integer tensor \[n\], got shape"):
            F.write_kv_rows(c, "fp8_ds_mla", bad, torch.randn(bad.numel(), 576))
        with pytest.raises(ValueError, match="1-D integer tensor"):
            F.gather_kv_rows(c, "fp8_ds_mla", bad)
    # bf16 / V3.2 rows closer than a row apart overlap: the op refuses them, so do the readers and writers
    for fmt, row in (("bf16", 576), ("fp8_ds_mla", 656)):
        c = F.alloc_kv_cache(fmt, 2, 4, 576)
        tight = c.as_strided((2, 4, row), (4 * row, row - 8, 1))
        with pytest.raises(ValueError, match=rf"token stride \(stride\(1\)\) must be >= the row width {row}"):
            F.write_kv_rows(tight, fmt, torch.tensor([0]), torch.randn(1, 576))
        with pytest.raises(ValueError, match="must be >= the row width"):
            F.gather_kv_rows(tight, fmt, torch.tensor([1]))
    # a caller's page stride is used as given, 16-byte multiple or not (the CPU op takes any)
    assert F.alloc_kv_cache("fp8_ds_mla_v4", 2, 4, page_stride=2341).stride() == (2341, 584, 1)


def test_v4_page_stride_too_small_raises():
    with pytest.raises(ValueError, match="page_stride"):
        F.pack_fp8_ds_mla_v4(_kv((2, 8, 512), seed=6), page_stride=8 * 584 - 1)


# ---------------------------------------------------------------------------------------------
# readers: only selected slots, strided views, offsets
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_format,d_qk", [("bf16", 576), ("bf16", 512), ("fp8_ds_mla", 576),
                                            ("fp8_ds_mla_v4", 512), ("fp8_ds_mla_fnuz", 576),
                                            ("fp8_ds_mla_v4_fnuz", 512)])
def test_gather_reads_only_selected_slots(kv_format, d_qk):
    num_pages, page_size = 5, 8
    cache = F.alloc_kv_cache(kv_format, num_pages, page_size, d_qk)  # all NaN / 0xFF
    slots = torch.tensor([33, 2, 17, 8, 39])
    rows = _kv((5, d_qk), seed=7)
    F.write_kv_rows(cache, kv_format, slots, rows)
    got = F.gather_kv_rows(cache, kv_format, torch.tensor([17, 2, 2, 39]))
    assert got.shape == (4, d_qk) and got.dtype == torch.float32
    assert not torch.isnan(got).any()
    ref = F.gather_kv_rows(cache, kv_format, slots)
    assert torch.equal(got, ref[[2, 1, 1, 4]])
    full = F.unpack_kv_cache(cache, kv_format).reshape(-1, d_qk)
    written = torch.zeros(num_pages * page_size, dtype=torch.bool)
    written[slots] = True
    assert torch.isnan(full[~written]).any(dim=1).all()  # garbage decodes to NaN
    assert not torch.isnan(full[written]).any()
    # singleton head dim accepted
    got4 = F.gather_kv_rows(cache.unsqueeze(2), kv_format, torch.tensor([17, 2, 2, 39]))
    assert torch.equal(got4, got)
    with pytest.raises(IndexError):
        F.gather_kv_rows(cache, kv_format, torch.tensor([num_pages * page_size]))
    with pytest.raises(IndexError):
        F.gather_kv_rows(cache, kv_format, torch.tensor([-1]))


def test_v4_views_with_storage_offset():
    kv = _kv((4, 8, 512), seed=8)
    cache = F.pack_fp8_ds_mla_v4(kv, page_stride=8 * 584 + 576)
    full = F.unpack_kv_cache(cache, "fp8_ds_mla_v4")
    sub = cache[1:3]  # storage_offset = one page stride
    assert sub.storage_offset() == cache.stride(0)
    assert torch.equal(F.unpack_kv_cache(sub, "fp8_ds_mla_v4"), full[1:3])
    assert torch.equal(F.gather_kv_rows(sub, "fp8_ds_mla_v4", torch.tensor([0, 15])),
                       full.reshape(-1, 512)[[8, 23]])


def test_v32_strided_pages():
    kv = _kv((6, 4, 576), seed=9)
    cache = F.pack_fp8_ds_mla(kv)
    sub = cache[::2]  # page stride 2 * 4 * 656
    assert torch.equal(F.unpack_kv_cache(sub, "fp8_ds_mla"), F.unpack_kv_cache(cache, "fp8_ds_mla")[::2])


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        F.gather_kv_rows(torch.zeros(2, 4, 600, dtype=torch.uint8), "fp8_ds_mla", torch.tensor([0]))
    with pytest.raises(ValueError):
        F.gather_kv_rows(torch.zeros(2, 4, 576), "bf16", torch.tensor([0]))  # not bf16
    with pytest.raises(ValueError):
        F.pack_fp8_ds_mla(torch.zeros(2, 4, 512))
    with pytest.raises(ValueError):
        F.pack_fp8_ds_mla_v4(torch.zeros(2, 4, 576))


# ---------------------------------------------------------------------------------------------
# FP8 flavours: e4m3fn (NVIDIA, gfx950) and e4m3fnuz (gfx942 engines)
# ---------------------------------------------------------------------------------------------


def test_format_properties():
    assert [F.kv_layout(f) for f in F.KV_FORMATS] == ["bf16", "fp8_ds_mla", "fp8_ds_mla_v4", "fp8_ds_mla",
                                                      "fp8_ds_mla_v4"]
    assert [F.is_fnuz(f) for f in F.KV_FORMATS] == [False, False, False, True, True]
    assert F.fp8_dtype("bf16") is None
    assert F.fp8_dtype("fp8_ds_mla_v4") == torch.float8_e4m3fn
    assert F.fp8_dtype("fp8_ds_mla_fnuz") == torch.float8_e4m3fnuz
    assert F.fp8_max("fp8_ds_mla") == 448.0 and F.fp8_max("fp8_ds_mla_v4_fnuz") == 240.0
    with pytest.raises(ValueError):
        F.fp8_max("bf16")
    for bad in ("fnuz", "fp8_ds_mla_v4_fn", "bf16_fnuz"):
        with pytest.raises(ValueError, match="kv_format"):
            F.kv_layout(bad)


@pytest.mark.parametrize("fnuz", [False, True])
def test_e4m3_every_byte(fnuz):
    """All 256 bytes against a table built from the bit fields (not from torch's float8 types)."""
    table = e4m3_reference_table(fnuz)
    got = F.e4m3_to_float(torch.arange(256).to(torch.uint8), fnuz, dtype=torch.float64)
    assert torch.equal(torch.isnan(got), torch.isnan(table))
    fin = ~torch.isnan(table)
    assert torch.equal(got[fin], table[fin])
    assert torch.equal(torch.signbit(got[fin]), torch.signbit(table[fin]))  # e4m3fn 0x80 is -0
    assert int(torch.isnan(table).sum()) == (1 if fnuz else 2)
    f32 = F.e4m3_to_float(torch.arange(256).to(torch.uint8), fnuz)
    assert f32.dtype == torch.float32 and torch.equal(f32.double()[fin], table[fin])
    if fnuz:  # the three bytes where fnuz is not "half of fn"
        assert got[0x7F].item() == 240.0 and got[0xFF].item() == -240.0 and torch.isnan(got[0x80])
        fn = e4m3_reference_table(False)
        other = torch.ones(256, dtype=torch.bool)
        other[[0x7F, 0xFF, 0x80]] = False
        assert torch.equal(got[other], fn[other] / 2)


def _raw_fp8_cache(kv_format, latent, scales, rope):
    """A one-page cache holding the given raw rows: latent [n, 512 | 448] uint8, scales [n, 4] fp32
    (V3.2) or [n, 7] UE8M0 uint8 (V4), rope [n, 64] bf16."""
    n = latent.shape[0]
    cache = F.alloc_kv_cache(kv_format, 1, n)
    if F.kv_layout(kv_format) == "fp8_ds_mla":
        cache[0, :, :512] = latent
        cache[0, :, 512:528] = scales.to(torch.float32).contiguous().view(torch.uint8)
        cache[0, :, 528:] = rope.contiguous().view(torch.uint8)
    else:
        data, sc = F._v4_views(cache)
        data[0, :, :448] = latent
        data[0, :, 448:] = rope.contiguous().view(torch.uint8)
        sc[0, :, :7] = scales
        sc[0, :, 7] = 0
    return cache


@pytest.mark.parametrize("kv_format", FP8_FORMATS)
def test_unpack_every_byte_value(kv_format):
    """A cache whose value bytes take all 256 values, at every scale tile, decodes to the
    independently computed table times the tile's scale (NaN exactly at the flavour's NaN codes)."""
    fnuz = F.is_fnuz(kv_format)
    v32 = F.kv_layout(kv_format) == "fp8_ds_mla"
    nlat, tile = (512, 128) if v32 else (448, 64)
    n = 6
    j = torch.arange(nlat)
    latent = torch.stack([((j * (2 * r + 1) + 97 * r) % 256) for r in range(n)]).to(torch.uint8)
    # every row holds every byte value (nlat >= 256 and j -> (2r+1) j + c is a bijection mod 256)
    for r in range(n):
        assert set(latent[r].tolist()) == set(range(256))
    g = torch.Generator().manual_seed(31)
    if v32:
        scales = torch.tensor([0.75, 3.0 * 2 ** -5, 40.0, 1.0])[None].repeat(n, 1) * (1 + torch.arange(n))[:, None]
        scale_f = scales.double()
    else:
        scales = torch.randint(100, 150, (n, 7), generator=g).to(torch.uint8)
        scale_f = F.ue8m0_to_float(scales).double()
    rope = torch.randn(n, 64, generator=g).to(torch.bfloat16)
    cache = _raw_fp8_cache(kv_format, latent, scales, rope)
    got = F.unpack_kv_cache(cache, kv_format, dtype=torch.float64)[0]
    table = e4m3_reference_table(fnuz)
    want_lat = table[latent.long()] * scale_f.repeat_interleave(tile, dim=1)
    want = torch.cat([want_lat, rope.double()], dim=1)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    fin = ~torch.isnan(want)
    assert torch.equal(got[fin], want[fin])
    nan_codes = [0x80] if fnuz else [0x7F, 0xFF]
    assert torch.equal(torch.isnan(got[:, :nlat]), torch.isin(latent, torch.tensor(nan_codes, dtype=torch.uint8)))


def test_fnuz_quantisation_by_hand():
    """Saturation at +-240 (bytes 0x7F / 0xFF), UE8M0 exponent from amax/240, no 0x80 for zeros."""
    kv = torch.zeros(1, 2, 512)
    kv[0, 0, 0] = 240.0  # tile 0: amax 240 -> e = 0 -> byte 127; 240 -> 0x7F
    kv[0, 0, 1] = 1.5  # e4m3fnuz 1.5 = 0.1000.100 = 0x44
    kv[0, 0, 2] = -240.0  # 0xFF
    kv[0, 0, 3] = -0.0  # zero: 0x00, never 0x80 (NaN in fnuz)
    kv[0, 0, 4] = -1e-9  # rounds to zero: 0x00
    kv[0, 0, 64] = 1.0  # tile 1: amax 1 -> e = ceil(log2(1/240)) = -7 -> byte 120; 1*2^7 = 128 = 0x78
    kv[0, 0, 128] = 1000.0  # tile 2: e = ceil(log2(1000/240)) = 3 -> byte 130; 125 -> 0x77 (120) / 0x78 (128)
    kv[0, 0, 129] = -1000.0
    kv[0, 1, :448] = torch.linspace(-3.0, 3.0, 448)
    cache = F.pack_fp8_ds_mla_v4(kv, fnuz=True)
    data, sc = F._v4_views(cache)
    row = data[0, 0].tolist()
    assert row[:5] == [0x7F, 0x44, 0xFF, 0x00, 0x00]
    assert row[64] == 0x78
    assert row[128] == 0x78 and row[129] == 0xF8  # 125 rounds to 128 (spacing 8 at 2^7)
    # zero tiles: amax 1e-4 -> e = ceil(log2(1e-4/240)) = -21 -> byte 106
    assert sc[0, 0].tolist() == [127, 120, 130, 106, 106, 106, 106, 0]
    assert 0x80 not in data[0, :, :448].reshape(-1).tolist()
    # power-of-two scales: every tile's largest stored magnitude lies in (120, 240]
    tmax = F.e4m3_to_float(data[0, 1, :448].contiguous(), fnuz=True).abs().reshape(7, 64).amax(-1)
    assert bool((tmax > 120).all()) and bool((tmax <= 240).all())
    # V3.2: fp32 scale amax / 240
    kv = torch.zeros(1, 1, 576)
    kv[0, 0, 0] = 240.0
    kv[0, 0, 1] = 1.5
    kv[0, 0, 128] = -2.0  # scale 2/240, stored -240 = 0xFF
    kv[0, 0, 256:384] = torch.linspace(-7.0, 5.0, 128)  # tile 2: maximum magnitude at -7 -> 0xFF
    row = F.pack_fp8_ds_mla(kv, fnuz=True)[0, 0].tolist()
    assert row[0] == 0x7F and row[1] == 0x44 and row[128] == 0xFF
    assert row[256] == 0xFF and max(row[256:384]) == 0xFF and 0x7F not in row[256:384]
    assert bytes(row[512:516]) == struct.pack("<f", 1.0)
    assert bytes(row[516:520]) == struct.pack("<f", struct.unpack("<f", struct.pack("<f", 2.0 / 240.0))[0])
    assert bytes(row[520:524]) == struct.pack("<f", struct.unpack("<f", struct.pack("<f", 7.0 / 240.0))[0])
    assert bytes(row[524:528]) == struct.pack("<f", 1e-4 / 240.0)


@pytest.mark.parametrize("v4", [False, True])
def test_flavours_differ(v4):
    """The same values packed in both flavours: different bytes, each decoding within its bound,
    and reading fnuz bytes as fn (the mix-up the format names prevent) is off by ~2x."""
    kv = _kv((2, 8, 512 if v4 else 576), seed=12)
    fn_fmt, nz_fmt = ("fp8_ds_mla_v4", "fp8_ds_mla_v4_fnuz") if v4 else ("fp8_ds_mla", "fp8_ds_mla_fnuz")
    a, b = F.pack_kv_cache(kv, fn_fmt), F.pack_kv_cache(kv, nz_fmt)
    assert not torch.equal(F._v4_views(a)[0] if v4 else a, F._v4_views(b)[0] if v4 else b)
    ua, ub = F.unpack_kv_cache(a, fn_fmt), F.unpack_kv_cache(b, nz_fmt)
    n_lat = 448 if v4 else 512
    ref = kv[..., :n_lat].abs().amax()
    assert (ua[..., :n_lat] - kv[..., :n_lat]).abs().max() < ref / 8
    assert (ub[..., :n_lat] - kv[..., :n_lat]).abs().max() < ref / 8
    wrong = F.unpack_kv_cache(b, fn_fmt)[..., :n_lat]
    fin = torch.isfinite(wrong)
    ratio = wrong[fin].abs().sum() / ub[..., :n_lat][fin].abs().sum()
    assert 1.9 < float(ratio) < 2.1


def test_fnuz_pack_on_device(device):
    """torch's float8_e4m3fnuz conversion on the device never yields 0x80 (NaN) for zeros or
    underflowing negatives, and matches the CPU bytes."""
    kv = _kv((2, 4, 512), seed=13)
    kv[0, 0, :64] = -0.0
    kv[0, 1, :64] = torch.linspace(-1e-9, 0.0, 64)
    kv[0, 1, 0] = -5.0  # tile amax so the tiny values underflow
    cpu = F.pack_fp8_ds_mla_v4(kv, fnuz=True)
    dev = F.pack_fp8_ds_mla_v4(kv.to(device), fnuz=True)
    dcpu, ddev = F._v4_views(cpu)[0], F._v4_views(dev)[0].cpu()
    assert torch.equal(dcpu, ddev)
    assert 0x80 not in dcpu[..., :448].reshape(-1).tolist()
    kv32 = _kv((2, 4, 576), seed=14)
    kv32[1, 2, :128] = -0.0
    c32 = F.pack_fp8_ds_mla(kv32.to(device), fnuz=True).cpu()
    assert torch.equal(c32, F.pack_fp8_ds_mla(kv32, fnuz=True))
    assert 0x80 not in c32[..., :512].reshape(-1).tolist()


def test_write_kv_rows_refuses_repeated_slots():
    """write_kv_rows' slots must be distinct (a repeated slot would silently keep only one row):
    ValueError naming slots, cache untouched; distinct slots are written."""
    for fmt in ("bf16", "fp8_ds_mla", "fp8_ds_mla_v4"):
        d = 576 if fmt != "fp8_ds_mla_v4" else 512
        cache = F.alloc_kv_cache(fmt, 2, 16, **({"d_qk": d} if fmt == "bf16" else {}))
        before = cache.clone()
        kv = torch.randn(3, d)
        with pytest.raises(ValueError, match="slots: expected distinct slot ids"):
            F.write_kv_rows(cache, fmt, torch.tensor([5, 17, 5]), kv)
        assert torch.equal(cache.view(torch.uint8), before.view(torch.uint8))
        F.write_kv_rows(cache, fmt, torch.tensor([5, 17, 6]), kv)
        assert not torch.equal(cache.view(torch.uint8), before.view(torch.uint8))
