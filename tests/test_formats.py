"""Tests of mla_ext.formats: DeepSeek V3.2 / V4 KV cache byte layouts (CPU, pure PyTorch)."""

import struct

import pytest
import torch

import mla_ext.formats as F


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
# bf16 (8 significant bits): |x_hat - x| <= |x| * 2^-8.


def _fp8_bound(x, scale):
    return torch.maximum(x.abs() / 16, scale * 2.0 ** -10) + x.abs() * 2.0 ** -22


def _check_v32_rows(x, x_hat):
    n = x.shape[0]
    lat = x[:, :512].double().reshape(n, 4, 128)
    amax = lat.abs().amax(-1).clamp_min(1e-4)
    scale = (amax / 448.0).unsqueeze(-1)
    err = (x_hat[:, :512].reshape(n, 4, 128) - lat).abs()
    assert bool((err <= _fp8_bound(lat, scale)).all()), float((err - _fp8_bound(lat, scale)).max())
    rope = x[:, 512:].double()
    assert bool(((x_hat[:, 512:] - rope).abs() <= rope.abs() * 2.0 ** -8).all())


def _check_v4_rows(x, x_hat, scale_bytes):
    n = x.shape[0]
    nope = x[:, :448].double().reshape(n, 7, 64)
    amax = nope.abs().amax(-1).clamp_min(1e-4)
    scale = F.ue8m0_to_float(scale_bytes[:, :7]).double()  # 2^e
    # e = ceil(log2(amax / 448)): amax/448 <= 2^e < 2 * amax/448
    assert bool((scale >= amax / 448).all()) and bool((scale < 2 * amax / 448).all())
    err = (x_hat[:, :448].reshape(n, 7, 64) - nope).abs()
    bound = _fp8_bound(nope, scale.unsqueeze(-1))
    assert bool((err <= bound).all()), float((err - bound).max())
    rope = x[:, 448:].double()
    assert bool(((x_hat[:, 448:] - rope).abs() <= rope.abs() * 2.0 ** -8).all())


def _special_tiles_v32(kv):
    kv[0, 0, :128] = torch.linspace(-1e-6, 1e-6, 128)  # amax below the 1e-4 floor
    kv[0, 1, 128:256] = 0.0  # all-zero tile
    kv[0, 2, 256:384] *= 1e4  # huge tile
    kv[0, 3, 384:512] = 3e-5  # constant tiny tile
    return kv


def test_v32_roundtrip_error_bound():
    kv = _special_tiles_v32(_kv((3, 16, 576), seed=0))
    cache = F.pack_fp8_ds_mla(kv)
    assert cache.shape == (3, 16, 656) and cache.dtype == torch.uint8 and cache.is_contiguous()
    x_hat = F.unpack_kv_cache(cache, "fp8_ds_mla", dtype=torch.float64)
    assert x_hat.shape == (3, 16, 576)
    _check_v32_rows(kv.reshape(-1, 576), x_hat.reshape(-1, 576))
    assert torch.equal(x_hat[0, 1, 128:256], torch.zeros(128, dtype=torch.float64))
    # float32 result agrees with the float64 one to fp32 rounding
    x32 = F.unpack_kv_cache(cache, "fp8_ds_mla")
    assert x32.dtype == torch.float32
    torch.testing.assert_close(x32.double(), x_hat, rtol=2 ** -23, atol=0)
    # not trivially exact: quantisation did happen
    assert float((x_hat - kv.double()).abs().max()) > 0


def test_v4_roundtrip_error_bound():
    kv = _kv((3, 16, 512), seed=1)
    kv[0, 0, :64] = torch.linspace(-1e-6, 1e-6, 64)
    kv[0, 1, 64:128] = 0.0
    kv[0, 2, 128:192] *= 1e4
    kv[0, 3, 384:448] = 3e-5
    cache = F.pack_fp8_ds_mla_v4(kv)
    assert cache.shape == (3, 16, 584) and cache.dtype == torch.uint8
    x_hat = F.unpack_kv_cache(cache, "fp8_ds_mla_v4", dtype=torch.float64)
    _, scales = F._v4_views(cache)
    _check_v4_rows(kv.reshape(-1, 512), x_hat.reshape(-1, 512), scales.reshape(-1, 8))
    assert torch.equal(x_hat[0, 1, 64:128], torch.zeros(64, dtype=torch.float64))
    # power-of-two scales: float32 dequantisation is exact
    assert torch.equal(F.unpack_kv_cache(cache, "fp8_ds_mla_v4").double(), x_hat)
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


def test_bytes_per_row():
    assert F.kv_bytes_per_row("bf16", 576) == 1152
    assert F.kv_bytes_per_row("bf16", 512) == 1024
    assert F.kv_bytes_per_row("fp8_ds_mla") == 656
    assert F.kv_bytes_per_row("fp8_ds_mla_v4", 512) == 584
    assert F.D_QK == {"bf16": None, "fp8_ds_mla": 576, "fp8_ds_mla_v4": 512}
    assert F.ROW_BYTES == {"fp8_ds_mla": 656, "fp8_ds_mla_v4": 584}


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


def test_v4_page_stride_too_small_raises():
    with pytest.raises(ValueError, match="page_stride"):
        F.pack_fp8_ds_mla_v4(_kv((2, 8, 512), seed=6), page_stride=8 * 584 - 1)


# ---------------------------------------------------------------------------------------------
# readers: only selected slots, strided views, offsets
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_format,d_qk", [("bf16", 576), ("bf16", 512), ("fp8_ds_mla", 576),
                                            ("fp8_ds_mla_v4", 512)])
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
