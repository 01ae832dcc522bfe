"""DeepSeek paged latent KV cache byte formats (pure PyTorch).

Five ``kv_format`` values are understood (DESIGN.md section 4): three layouts, and two of them
again with e4m3fnuz value bytes:

``"bf16"``
    ``[num_pages, page_size, d_qk]`` bfloat16, d_qk = 576 (V3.2) or 512 (V4). A singleton head
    dim ``[num_pages, page_size, 1, d_qk]`` is accepted by the readers.

``"fp8_ds_mla"`` (DeepSeek V3.2, 656 bytes per token, everything inline per token)
    ``[num_pages, page_size, 656]`` uint8. Per token: bytes [0, 512) e4m3fn latent values,
    [512, 528) four little-endian fp32 scales (scale j covers latent elements [128j, 128j+128)),
    [528, 656) the 64 RoPE values as bf16. d_qk = 576.

``"fp8_ds_mla_v4"`` (DeepSeek V4, 584 bytes per token, per page "data then scales")
    A uint8 view ``[num_pages, page_size, 584]`` with strides ``(page_stride, 584, 1)``. The
    logical rows of that view are NOT the token rows; the bytes of page n start at
    ``n * page_stride`` and hold: token p's data row at ``p * 576`` ([0, 448) e4m3fn of the
    448 no-RoPE dims, [448, 576) the 64 RoPE dims as bf16), then after all ``page_size`` data rows,
    at ``page_size * 576 + p * 8``: 7 UE8M0 scale bytes (byte j covers dims [64j, 64j+64)) and
    one padding byte. ``page_stride`` (= ``stride(0)``, in bytes) is padded; engines round it up
    to a multiple of 576. d_qk = 512. ``page_size`` is read from ``shape[1]`` and places the
    scales, so a view that slices dim 1 (``cache[:, :4]`` of 64-row pages) is not a V4 cache:
    nothing in the view tells it from a cache of 4-row pages with padded page strides, and its
    rows are read with the wrong scales. Slice pages (dim 0) only.

``"fp8_ds_mla_fnuz"`` / ``"fp8_ds_mla_v4_fnuz"`` (the same two layouts, byte for byte)
    The FP8 value bytes are e4m3fnuz instead of OCP e4m3fn; scales (fp32 / UE8M0) and RoPE
    (bf16) are unchanged. Which flavour a cache holds depends on the engine and the GPU that
    wrote it: NVIDIA and AMD gfx950 (MI350) engines write OCP e4m3fn; gfx942 (MI300) engines may
    write e4m3fnuz. e4m3fnuz has exponent bias 8 (e4m3fn: 7), no infinities, no negative zero:
    0x80 is its only NaN, and 0x7F / 0xFF are +-240, its largest magnitude (e4m3fn: NaN; its
    largest is 448). For the same bits, the fnuz value is half the fn value except at those three
    bytes. Quantisation saturates to +-240 instead of +-448 (see :func:`write_kv_rows`).

Readers (:func:`gather_kv_rows`, :func:`unpack_kv_cache`) compute byte addresses from the cache
tensor's storage, offset and ``stride(0)``, and only touch the slots asked for, so unused slots
may hold NaN/garbage.

Wherever an FP8 cache tensor is taken (readers, writers, :mod:`mla_ext.reference`, the ops),
uint8, int8 and the format's own float8 type (``torch.float8_e4m3fn``, or ``torch.float8_e4m3fnuz``
for the ``_fnuz`` formats) are accepted and read as raw bytes.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._ops import int_arg, is_integer_dtype

__all__ = [
    "FP8_MAX",
    "FP8_MAX_FNUZ",
    "UE8M0_BIAS",
    "KV_FORMATS",
    "D_QK",
    "ROW_BYTES",
    "V4_DATA_BYTES",
    "V4_SCALE_BYTES",
    "GARBAGE_BYTE",
    "kv_layout",
    "is_fnuz",
    "fp8_dtype",
    "fp8_max",
    "e4m3_to_float",
    "ue8m0_to_float",
    "float_to_ue8m0_exponent",
    "kv_bytes_per_row",
    "default_v4_page_stride",
    "alloc_kv_cache",
    "write_kv_rows",
    "pack_fp8_ds_mla",
    "pack_fp8_ds_mla_v4",
    "pack_kv_cache",
    "gather_kv_rows",
    "unpack_kv_cache",
]

#: Largest finite OCP float8_e4m3fn magnitude.
FP8_MAX = 448.0
#: Largest finite float8_e4m3fnuz magnitude (bytes 0x7F / 0xFF).
FP8_MAX_FNUZ = 240.0
#: UE8M0 byte b encodes 2 ** (b - UE8M0_BIAS).
UE8M0_BIAS = 127
#: Smallest tile amax used when quantising (avoids a zero scale for all-zero tiles).
AMAX_FLOOR = 1e-4

KV_FORMATS = ("bf16", "fp8_ds_mla", "fp8_ds_mla_v4", "fp8_ds_mla_fnuz", "fp8_ds_mla_v4_fnuz")
#: Byte layout of each format (a fnuz format is laid out exactly like its e4m3fn twin).
_LAYOUT = {"bf16": "bf16", "fp8_ds_mla": "fp8_ds_mla", "fp8_ds_mla_v4": "fp8_ds_mla_v4",
           "fp8_ds_mla_fnuz": "fp8_ds_mla", "fp8_ds_mla_v4_fnuz": "fp8_ds_mla_v4"}
#: Query/key width per format (None: taken from the bf16 cache's last dim, 576 or 512).
D_QK = {"bf16": None, "fp8_ds_mla": 576, "fp8_ds_mla_v4": 512, "fp8_ds_mla_fnuz": 576,
        "fp8_ds_mla_v4_fnuz": 512}
#: Bytes per token of the FP8 formats (V4: 576 data + 8 scale bytes, page padding excluded).
ROW_BYTES = {"fp8_ds_mla": 656, "fp8_ds_mla_v4": 584, "fp8_ds_mla_fnuz": 656, "fp8_ds_mla_v4_fnuz": 584}
#: V4: bytes of one token's data row (448 e4m3fn + 64 bf16) and of its scale group (7 + 1 pad).
V4_DATA_BYTES = 576
V4_SCALE_BYTES = 8
#: Byte written into every slot/padding byte that must never be read. As e4m3fn, UE8M0, a bf16
#: pair or an fp32 quad it decodes to NaN, so a kernel that reads it produces NaN. (As e4m3fnuz it
#: is -240, but a garbage row's scales are NaN, so every element of it still decodes to NaN.)
GARBAGE_BYTE = 0xFF

_D_V = 512  # value width of every DeepSeek MLA layout
_V32_LATENT = 512
_V32_TILE = 128
_V4_NOPE = 448
_V4_TILE = 64
_ROPE = 64


# ----------------------------------------------------------------------------------------------
# format properties
# ----------------------------------------------------------------------------------------------


def kv_layout(kv_format: str) -> str:
    """Byte layout of ``kv_format``: ``"bf16"``, ``"fp8_ds_mla"`` or ``"fp8_ds_mla_v4"`` (a fnuz
    format maps to its e4m3fn twin). ValueError for an unknown format."""
    _check_format(kv_format)
    return _LAYOUT[kv_format]


def is_fnuz(kv_format: str) -> bool:
    """True for the formats whose FP8 bytes are e4m3fnuz (``"fp8_ds_mla_fnuz"``,
    ``"fp8_ds_mla_v4_fnuz"``)."""
    _check_format(kv_format)
    return kv_format.endswith("_fnuz")


def fp8_dtype(kv_format: str) -> Optional[torch.dtype]:
    """torch dtype of the FP8 value bytes: ``torch.float8_e4m3fn``, ``torch.float8_e4m3fnuz``, or
    None for ``"bf16"``."""
    if kv_layout(kv_format) == "bf16":
        return None
    return torch.float8_e4m3fnuz if is_fnuz(kv_format) else torch.float8_e4m3fn


def fp8_max(kv_format: str) -> float:
    """Largest FP8 magnitude quantisation saturates to: 448 (e4m3fn) or 240 (e4m3fnuz).
    ValueError for ``"bf16"``."""
    if kv_layout(kv_format) == "bf16":
        raise ValueError("fp8_max: kv_format 'bf16' has no FP8 values")
    return FP8_MAX_FNUZ if is_fnuz(kv_format) else FP8_MAX


# ----------------------------------------------------------------------------------------------
# scalars
# ----------------------------------------------------------------------------------------------


def e4m3_to_float(byte_tensor: torch.Tensor, fnuz: bool = False,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode e4m3 bytes exactly.

    Args:
        byte_tensor: any shape, uint8, any device and strides.
        fnuz: False for OCP e4m3fn (bias 7, 0x7F / 0xFF NaN, 0x80 = -0, max 448), True for
            e4m3fnuz (bias 8, 0x80 the only NaN, 0x7F / 0xFF = +-240, no -0).
        dtype: result dtype (float32 and float64 are exact).

    Returns:
        ``dtype`` tensor of the same shape.
    """
    if byte_tensor.dtype != torch.uint8:
        raise ValueError(f"e4m3_to_float: expected a uint8 tensor, got {byte_tensor.dtype}")
    return byte_tensor.contiguous().view(torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn).to(dtype)



def ue8m0_to_float(byte_tensor: torch.Tensor) -> torch.Tensor:
    """Decode UE8M0 scale bytes (DeepSeek V4 KV cache / MX-style power-of-two scales).

    Args:
        byte_tensor: any shape, uint8 (or any integer dtype holding values 0..255), any device
            and strides.

    Returns:
        float32 tensor of the same shape: byte b -> 2 ** (b - 127), built from the fp32 bit
        pattern (exact, no pow, no flush): b = 0 -> 2 ** -127 (denormal, bits ``1 << 22``),
        b = 127 -> 1.0, b = 254 -> 2 ** 127, b = 255 -> NaN.

    Raises:
        ValueError: ``byte_tensor`` of a floating or bool dtype (the bytes are integers; a
            float tensor would be truncated silently). Integer values outside 0..255 are not
            checked (that would read the tensor on the host): their low 8 bits are decoded.
    """
    if not is_integer_dtype(byte_tensor.dtype):
        raise ValueError(f"ue8m0_to_float: expected an integer tensor of bytes, got {byte_tensor.dtype}")
    b = byte_tensor.to(torch.int32) & 0xFF
    bits = b << 23
    bits = torch.where(b == 0, torch.full_like(bits, 1 << 22), bits)
    bits = torch.where(b == 255, torch.full_like(bits, 0x7FC00000), bits)
    return bits.view(torch.float32)


def float_to_ue8m0_exponent(x: torch.Tensor) -> torch.Tensor:
    """Smallest integer e with 2 ** e >= x, i.e. ceil(log2(x)), computed exactly.

    Args:
        x: any shape, floating dtype, values > 0 and finite (e.g. ``amax / 448`` of a tile);
            not checked (that would read them on the host): 0, negative, inf or NaN values give
            meaningless exponents.

    Returns:
        int32 tensor of the same shape, the unbiased exponent e (not clamped; the stored UE8M0
        byte is ``clamp(e + 127, 0, 255)``). Computed with ``frexp`` in float64 so that exact
        powers of two map to their own exponent (no log2 rounding).
    """
    mant, ex = torch.frexp(x.to(torch.float64))
    return (ex - (mant == 0.5).to(ex.dtype)).to(torch.int32)


def kv_bytes_per_row(kv_format: str, d_qk: Optional[int] = None) -> int:
    """Bytes a kernel must read per selected KV row (for bandwidth numbers in benchmarks).

    Args:
        kv_format: one of :data:`KV_FORMATS`: ``"bf16"``, ``"fp8_ds_mla"`` (V3.2),
            ``"fp8_ds_mla_v4"`` (V4) or their ``_fnuz`` twins.
        d_qk: row width in elements; required for ``"bf16"`` (576 or 512); optional for the
            FP8 formats, where it must be theirs (576 V3.2, 512 V4), as in :func:`alloc_kv_cache`.

    Returns:
        bytes: ``2 * d_qk`` for bf16, 656 for fp8_ds_mla[_fnuz], 584 for fp8_ds_mla_v4[_fnuz]
        (576 data bytes + 8 scale bytes; page padding is not counted).

    Raises:
        ValueError: an unknown ``kv_format``, a missing or wrong ``d_qk``. TypeError: ``d_qk``
            not an integer.
    """
    _check_format(kv_format)
    d_qk = _format_d_qk("kv_bytes_per_row", kv_format, d_qk)
    return 2 * d_qk if kv_format == "bf16" else ROW_BYTES[kv_format]


def _format_d_qk(fn: str, kv_format: str, d_qk) -> int:
    """The row width (elements) of a known ``kv_format``: ``d_qk`` itself for bf16 (required, 512
    or 576), else the format's own, which ``d_qk`` must equal when given."""
    if d_qk is not None:
        d_qk = int_arg(fn, "d_qk", d_qk)
    if kv_format == "bf16":
        if d_qk is None:
            raise ValueError(f"{fn}: d_qk is required for kv_format='bf16'")
        if d_qk not in (512, 576):
            raise ValueError(f"{fn}: expected d_qk 576 (V3.2) or 512 (V4) for kv_format='bf16', got {d_qk}")
        return d_qk
    if d_qk is not None and d_qk != D_QK[kv_format]:
        raise ValueError(f"{fn}: kv_format {kv_format!r} has d_qk {D_QK[kv_format]}, got {d_qk}")
    return D_QK[kv_format]


def default_v4_page_stride(page_size: int) -> int:
    """Default V4 page stride in bytes: ``page_size * 584`` rounded up to a multiple of 576.

    Raises:
        TypeError: ``page_size`` not an integer. ValueError: ``page_size < 1``.
    """
    page_size = int_arg("default_v4_page_stride", "page_size", page_size)
    if page_size < 1:
        raise ValueError(f"default_v4_page_stride: expected page_size >= 1, got {page_size}")
    raw = page_size * ROW_BYTES["fp8_ds_mla_v4"]
    return -(-raw // V4_DATA_BYTES) * V4_DATA_BYTES


# ----------------------------------------------------------------------------------------------
# row codecs (rows are independent in every format: tiles never cross a token)
# ----------------------------------------------------------------------------------------------


def _check_page_stride_format(fn: str, kv_format: str, page_stride) -> None:
    """A page_stride is a V4-layout argument: a ValueError with any other (known) format."""
    if page_stride is not None and _LAYOUT[kv_format] != "fp8_ds_mla_v4":
        raise ValueError(f"{fn}: page_stride applies to the V4 layouts (fp8_ds_mla_v4[_fnuz]) only, "
                         f"got page_stride={page_stride!r} with kv_format={kv_format!r}")


def _check_format(kv_format: str) -> None:
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format must be one of {KV_FORMATS}, got {kv_format!r}")


def _encode_v32_rows(x: torch.Tensor, fnuz: bool = False) -> torch.Tensor:
    """x [n, 576] float -> [n, 656] uint8 (fp8_ds_mla[_fnuz] token rows)."""
    n = x.shape[0]
    x = x.to(torch.float32)
    fmax = FP8_MAX_FNUZ if fnuz else FP8_MAX
    lat = x[:, :_V32_LATENT].reshape(n, _V32_LATENT // _V32_TILE, _V32_TILE)
    amax = lat.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)  # [n, 4]
    # a tensor divisor: torch's CPU kernel turns division by a Python scalar into a multiply by
    # its reciprocal (1 ulp off at times), the GPU's does not; the bytes must not depend on device
    scale = (amax / torch.full_like(amax, fmax)).to(torch.float32)
    fp8 = torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn
    q = (lat / scale.unsqueeze(-1)).clamp(-fmax, fmax).to(fp8)
    out = torch.empty((n, ROW_BYTES["fp8_ds_mla"]), dtype=torch.uint8, device=x.device)
    out[:, :512] = q.reshape(n, _V32_LATENT).view(torch.uint8)
    out[:, 512:528] = scale.contiguous().view(torch.uint8)
    out[:, 528:656] = x[:, _V32_LATENT:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return out


def _decode_v32_rows(rows: torch.Tensor, dtype: torch.dtype, fnuz: bool = False) -> torch.Tensor:
    """rows [n, 656] uint8 -> [n, 576] dtype."""
    rows = rows.contiguous()
    n = rows.shape[0]
    lat = e4m3_to_float(rows[:, :512], fnuz, dtype)
    scale = rows[:, 512:528].contiguous().view(torch.float32).to(dtype)  # [n, 4]
    lat = (lat.reshape(n, 4, _V32_TILE) * scale.unsqueeze(-1)).reshape(n, _V32_LATENT)
    rope = rows[:, 528:656].contiguous().view(torch.bfloat16).to(dtype)
    return torch.cat([lat, rope], dim=1)


def _encode_v4_rows(x: torch.Tensor, fnuz: bool = False):
    """x [n, 512] float -> (data [n, 576] uint8, scales [n, 8] uint8)."""
    n = x.shape[0]
    x = x.to(torch.float32)
    fmax = FP8_MAX_FNUZ if fnuz else FP8_MAX
    nope = x[:, :_V4_NOPE].reshape(n, _V4_NOPE // _V4_TILE, _V4_TILE)
    amax = nope.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)  # [n, 7]
    e = float_to_ue8m0_exponent(amax.to(torch.float64) / fmax)
    byte = (e + UE8M0_BIAS).clamp(0, 255)
    # 2 ** -e_stored as an exact fp32 built from bits (e_stored = byte - 127, in [-22, 121] for
    # finite inputs, so 127 - e_stored = 254 - byte stays in 1..254).
    inv_scale = ue8m0_to_float((2 * UE8M0_BIAS - byte).clamp(0, 254))
    fp8 = torch.float8_e4m3fnuz if fnuz else torch.float8_e4m3fn
    q = (nope * inv_scale.unsqueeze(-1)).clamp(-fmax, fmax).to(fp8)
    data = torch.empty((n, V4_DATA_BYTES), dtype=torch.uint8, device=x.device)
    data[:, :_V4_NOPE] = q.reshape(n, _V4_NOPE).view(torch.uint8)
    data[:, _V4_NOPE:] = x[:, _V4_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    scales = torch.zeros((n, V4_SCALE_BYTES), dtype=torch.uint8, device=x.device)
    scales[:, :7] = byte.to(torch.uint8)
    return data, scales


def _decode_v4_rows(data: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype,
                    fnuz: bool = False) -> torch.Tensor:
    """data [n, 576] uint8, scales [n, 8] uint8 -> [n, 512] dtype."""
    n = data.shape[0]
    nope = e4m3_to_float(data[:, :_V4_NOPE], fnuz, dtype)
    sc = ue8m0_to_float(scales[:, :7]).to(dtype)
    nope = (nope.reshape(n, 7, _V4_TILE) * sc.unsqueeze(-1)).reshape(n, _V4_NOPE)
    rope = data[:, _V4_NOPE:].contiguous().view(torch.bfloat16).to(dtype)
    return torch.cat([nope, rope], dim=1)


# ----------------------------------------------------------------------------------------------
# cache geometry
# ----------------------------------------------------------------------------------------------


def _squeeze_head(kv_cache: torch.Tensor, name: str = "kv_cache") -> torch.Tensor:
    if kv_cache.dim() == 4:
        if kv_cache.shape[2] != 1:
            raise ValueError(
                f"{name}: a 4-D cache must be [num_pages, page_size, 1, row], got {tuple(kv_cache.shape)}"
            )
        return kv_cache.select(2, 0)
    if kv_cache.dim() != 3:
        raise ValueError(
            f"{name}: expected [num_pages, page_size, row] (or [num_pages, page_size, 1, row]), "
            f"got {tuple(kv_cache.shape)}"
        )
    return kv_cache


def _cache_d_qk(kv_cache: torch.Tensor, kv_format: str) -> int:
    return int(kv_cache.shape[-1]) if kv_format == "bf16" else D_QK[kv_format]


def _check_cache(kv_cache: torch.Tensor, kv_format: str, name: str = "kv_cache") -> torch.Tensor:
    _check_format(kv_format)
    c = _squeeze_head(kv_cache, name)
    if c.shape[-1] > 1 and c.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got {c.stride()}")
    if kv_format == "bf16":
        if c.dtype != torch.bfloat16:
            raise ValueError(f"{name}: kv_format 'bf16' needs a bfloat16 tensor, got {c.dtype}")
    else:
        # The byte dtypes sparse_mla_decode accepts: uint8, int8, or the float8 type of the
        # format's own flavour (read as raw bytes).
        fp8 = torch.float8_e4m3fnuz if kv_format.endswith("_fnuz") else torch.float8_e4m3fn
        if c.dtype not in (torch.uint8, torch.int8, fp8):
            raise ValueError(f"{name}: kv_format {kv_format!r} needs a uint8 (or int8 / {fp8}) tensor, "
                             f"got {c.dtype}")
        c = c.view(torch.uint8)
        if c.shape[-1] != ROW_BYTES[kv_format]:
            raise ValueError(
                f"{name}: kv_format {kv_format!r} needs a last dim of {ROW_BYTES[kv_format]} bytes, "
                f"got {c.shape[-1]}"
            )
    if _LAYOUT[kv_format] == "fp8_ds_mla_v4" and c.shape[1] > 1 and c.stride(1) != ROW_BYTES["fp8_ds_mla_v4"]:
        raise ValueError(f"{name}: {kv_format} token stride (stride(1)) must be 584 bytes (the data rows "
                         f"and scale rows of a page are packed), got {c.stride(1)}")
    if _LAYOUT[kv_format] != "fp8_ds_mla_v4" and c.shape[1] > 1 and c.stride(1) < c.shape[-1]:
        raise ValueError(f"{name}: {kv_format} token stride (stride(1)) must be >= the row width {c.shape[-1]} "
                         f"(rows must not overlap, as sparse_mla_decode requires), got {c.stride(1)}")
    if _LAYOUT[kv_format] == "fp8_ds_mla_v4" and c.shape[0] > 1:
        need = c.shape[1] * ROW_BYTES["fp8_ds_mla_v4"]
        if c.stride(0) < need:
            raise ValueError(
                f"{name}: {kv_format} page stride (stride(0)) must be >= page_size*584 = {need} "
                f"bytes, got {c.stride(0)}"
            )
    return c


def _v4_views(c: torch.Tensor):
    """V4 cache view [P, S, 584] -> (data [P, S, 576], scales [P, S, 8]) uint8 views of its storage."""
    num_pages, page_size = c.shape[0], c.shape[1]
    ps = c.stride(0) if num_pages > 1 else max(c.stride(0), page_size * ROW_BYTES["fp8_ds_mla_v4"])
    off = c.storage_offset()
    data = c.as_strided((num_pages, page_size, V4_DATA_BYTES), (ps, V4_DATA_BYTES, 1), off)
    scales = c.as_strided(
        (num_pages, page_size, V4_SCALE_BYTES), (ps, V4_SCALE_BYTES, 1), off + page_size * V4_DATA_BYTES
    )
    return data, scales


def _split_slots(slots: torch.Tensor, cache: torch.Tensor, name: str = "slots"):
    """(page, offset) of each slot id of ``cache`` (``[num_pages, page_size, ...]``), on its device."""
    if not isinstance(slots, torch.Tensor):
        raise ValueError(f"{name}: expected an integer tensor [n], got {type(slots).__name__}")
    if not is_integer_dtype(slots.dtype):
        raise ValueError(f"{name}: expected an integer tensor, got {slots.dtype}")
    if slots.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D integer tensor [n], got shape {tuple(slots.shape)}")
    num_pages, page_size = cache.shape[0], cache.shape[1]
    s = slots.to(cache.device).to(torch.int64)
    if s.numel() and (bool((s < 0).any()) or bool((s >= num_pages * page_size).any())):
        raise IndexError(
            f"{name}: every slot must be in [0, num_pages*page_size) = [0, {num_pages * page_size}); "
            f"got min {int(s.min())}, max {int(s.max())}"
        )
    return s // page_size, s % page_size


# ----------------------------------------------------------------------------------------------
# writers
# ----------------------------------------------------------------------------------------------


def alloc_kv_cache(
    kv_format: str,
    num_pages: int,
    page_size: int,
    d_qk: Optional[int] = None,
    *,
    device="cpu",
    page_stride: Optional[int] = None,
) -> torch.Tensor:
    """Allocate a KV cache whose every byte is garbage (NaN under any reading).

    Args:
        kv_format: one of :data:`KV_FORMATS` (``"bf16"``, ``"fp8_ds_mla"`` (V3.2),
            ``"fp8_ds_mla_v4"`` (V4), or their ``_fnuz`` twins).
        num_pages, page_size: cache geometry (tokens per page), integers >= 0 and >= 1.
        d_qk: row width for ``"bf16"`` (576 or 512); must match the format otherwise if given.
        device: torch device.
        page_stride: V4 layouts only (a ValueError for the others), an integer number of bytes between pages, >=
            ``page_size * 584`` (default :func:`default_v4_page_stride`, a multiple of 576). Used
            as given: the GPU op needs a multiple of 16 and refuses others; the CPU op takes any.

    Returns:
        bf16: ``[num_pages, page_size, d_qk]`` bfloat16 filled with NaN.
        fp8_ds_mla[_fnuz]: ``[num_pages, page_size, 656]`` uint8 filled with 0xFF.
        fp8_ds_mla_v4[_fnuz]: uint8 view ``[num_pages, page_size, 584]``, strides
        ``(page_stride, 584, 1)``, over a flat buffer of ``num_pages * page_stride`` bytes filled
        with 0xFF. Fill rows with :func:`write_kv_rows`.
    """
    return _alloc("alloc_kv_cache", kv_format, num_pages, page_size, d_qk, device, page_stride)


def _alloc(fn: str, kv_format: str, num_pages, page_size, d_qk, device, page_stride) -> torch.Tensor:
    """alloc_kv_cache's body; its errors name ``fn`` (the public function the caller called)."""
    _check_format(kv_format)
    num_pages = int_arg(fn, "num_pages", num_pages)
    page_size = int_arg(fn, "page_size", page_size)
    if num_pages < 0 or page_size < 1:
        raise ValueError(f"{fn}: expected num_pages >= 0 and page_size >= 1, got {num_pages} and "
                         f"{page_size}")
    d_qk = _format_d_qk(fn, kv_format, d_qk)
    _check_page_stride_format(fn, kv_format, page_stride)
    if kv_format == "bf16":
        return torch.full((num_pages, page_size, d_qk), float("nan"), dtype=torch.bfloat16, device=device)
    if _LAYOUT[kv_format] == "fp8_ds_mla":
        return torch.full((num_pages, page_size, 656), GARBAGE_BYTE, dtype=torch.uint8, device=device)
    row = ROW_BYTES["fp8_ds_mla_v4"]
    if page_stride is None:
        page_stride = default_v4_page_stride(page_size)
    page_stride = int_arg(fn, "page_stride", page_stride)
    if page_stride < page_size * row:
        raise ValueError(f"{fn}: page_stride must be >= page_size*584 = {page_size * row} bytes, got {page_stride}")
    buf = torch.full((num_pages * page_stride,), GARBAGE_BYTE, dtype=torch.uint8, device=device)
    return buf.as_strided((num_pages, page_size, row), (page_stride, row, 1), 0)


def write_kv_rows(kv_cache: torch.Tensor, kv_format: str, slots: torch.Tensor, kv: torch.Tensor) -> None:
    """Quantise rows and store them at the given slots (in place; other bytes untouched).

    Args:
        kv_cache: a cache as produced by :func:`alloc_kv_cache` / :func:`pack_kv_cache`
            (see the module docstring for layouts); mutated.
        kv_format: one of :data:`KV_FORMATS`.
        slots: int ``[n]`` global slot ids (page * page_size + offset), distinct, in range.
        kv: ``[n, d_qk]`` float32/bf16/fp16 rows (d_qk 576 for fp8_ds_mla[_fnuz], 512 for
            fp8_ds_mla_v4[_fnuz]).

    Quantisation (round to nearest even), with M = 448 for the e4m3fn formats and M = 240 for the
    e4m3fnuz ones: fp8_ds_mla[_fnuz] (V3.2) per 128-element tile, amax = max(max|x|, 1e-4),
    fp32 scale = amax / M, byte = e4m3(clamp(x / scale, +-M)); RoPE dims as bf16.
    fp8_ds_mla_v4[_fnuz] per 64-element tile, e = ceil(log2(amax / M)), value
    e4m3(clamp(x / 2**e, +-M)), UE8M0 byte clamp(e + 127, 0, 255); pad byte 0; RoPE as bf16.
    +0 is stored as 0x00 in both flavours; -0 (and negatives that round to zero) as 0x80 in
    e4m3fn and as 0x00 in e4m3fnuz, which has no -0 (0x80 is its NaN). Rows are
    expected finite and are not checked (that would read them on the host): an inf or NaN
    encodes differently per format (e.g. a V3.2 tile with an inf reads back NaN, while a V4 tile
    with an inf gets the exponent 0 and its values clamped to +-M).

    Raises (before anything is written):
        ValueError: ``kv`` not ``[n, d_qk]``, its row count not that of ``slots``, ``slots`` not
            a 1-D integer tensor or holding a slot id twice, an unknown ``kv_format``, or a cache
            that does not match it (the message names the argument).
        IndexError: a slot id outside ``[0, num_pages * page_size)``.
    """
    c = _check_cache(kv_cache, kv_format)
    d_qk = _cache_d_qk(c, kv_format)
    _require_float_kv(kv, f"[n, {d_qk}]")
    if kv.dim() != 2 or kv.shape[1] != d_qk:
        raise ValueError(f"kv: expected [n, {d_qk}], got {tuple(kv.shape)}")
    page, off = _split_slots(slots, c)
    if kv.shape[0] != page.numel():
        raise ValueError(f"kv has {kv.shape[0]} rows but slots has {page.numel()} entries")
    if page.numel() > 1:
        s = page * c.shape[1] + off
        if torch.unique(s).numel() != s.numel():
            raise ValueError("slots: expected distinct slot ids (a repeated slot would keep only one of its rows)")
    kv = kv.to(c.device)
    layout, fnuz = _LAYOUT[kv_format], kv_format.endswith("_fnuz")
    if layout == "bf16":
        c[page, off] = kv.to(torch.bfloat16)
    elif layout == "fp8_ds_mla":
        c[page, off] = _encode_v32_rows(kv, fnuz)
    else:
        data_v, scale_v = _v4_views(c)
        data, scales = _encode_v4_rows(kv, fnuz)
        data_v[page, off] = data
        scale_v[page, off] = scales


def _require_float_kv(kv, shape: str) -> None:
    """ValueError naming ``kv`` unless it is a floating-point tensor (the writers' and packers' input;
    ``shape`` is the expected shape, for the message)."""
    if not isinstance(kv, torch.Tensor) or not kv.dtype.is_floating_point:
        raise ValueError(f"kv: expected a floating-point (float32 / bfloat16) tensor {shape}, got "
                         f"{kv.dtype if isinstance(kv, torch.Tensor) else type(kv).__name__}")


def _check_pack_input(kv, d_qks: Tuple[int, ...]) -> None:
    """The packers' input: a floating-point tensor [num_pages, page_size >= 1, d_qk] with d_qk one
    of ``d_qks``; ValueError naming ``kv`` otherwise (as write_kv_rows)."""
    want = " or ".join(str(d) for d in d_qks)
    _require_float_kv(kv, f"[num_pages, page_size, {want}]")
    if kv.dim() != 3 or kv.shape[-1] not in d_qks or kv.shape[1] < 1:
        raise ValueError(f"kv: expected [num_pages, page_size >= 1, {want}], got {tuple(kv.shape)}")


def pack_fp8_ds_mla(kv: torch.Tensor, *, fnuz: bool = False) -> torch.Tensor:
    """Pack a DeepSeek V3.2 latent cache into the ``"fp8_ds_mla"`` byte format
    (``"fp8_ds_mla_fnuz"`` with ``fnuz=True``).

    Args:
        kv: ``[num_pages, page_size, 576]`` float32 or bf16 (512 latent + 64 RoPE), any device.
        fnuz: write e4m3fnuz latent bytes (scale amax/240) instead of e4m3fn (scale amax/448).

    Returns:
        ``[num_pages, page_size, 656]`` uint8, contiguous: per token 512 e4m3 latent bytes
        (per 128-tile fp32 scale amax/448 or amax/240, amax floored at 1e-4), 4 little-endian fp32
        scales at bytes [512, 528), 64 bf16 RoPE values at [528, 656).
    """
    _check_pack_input(kv, (576,))
    num_pages, page_size, _ = kv.shape
    return _encode_v32_rows(kv.reshape(-1, 576), fnuz).reshape(num_pages, page_size, 656)


def pack_fp8_ds_mla_v4(kv: torch.Tensor, page_stride: Optional[int] = None, *, fnuz: bool = False) -> torch.Tensor:
    """Pack a DeepSeek V4 latent cache into the ``"fp8_ds_mla_v4"`` byte format
    (``"fp8_ds_mla_v4_fnuz"`` with ``fnuz=True``).

    Args:
        kv: ``[num_pages, page_size, 512]`` float32 or bf16 (448 no-RoPE + 64 RoPE), any device.
        page_stride: bytes between pages, an integer; default ``page_size * 584`` rounded up to a
            multiple of 576. Must be >= ``page_size * 584`` (ValueError otherwise); used as given
            (the GPU op needs a multiple of 16, the CPU op takes any).
        fnuz: write e4m3fnuz values (e = ceil(log2(amax/240))) instead of e4m3fn
            (e = ceil(log2(amax/448))).

    Returns:
        uint8 view ``[num_pages, page_size, 584]`` with strides ``(page_stride, 584, 1)`` over a
        flat buffer of ``num_pages * page_stride`` bytes. Page n: token p's data row at byte
        ``n*page_stride + p*576`` (448 e4m3 + 64 bf16), its 7 UE8M0 scale bytes + one 0 pad
        byte at ``n*page_stride + page_size*576 + p*8``. Bytes between pages are 0xFF (garbage).

    Raises:
        ValueError: ``kv`` not a floating-point ``[num_pages, page_size >= 1, 512]`` tensor;
            ``page_stride`` below ``page_size * 584``.
        TypeError: ``page_stride`` not an integer (a float, a bool).
    """
    return _pack_v4("pack_fp8_ds_mla_v4", kv, page_stride, fnuz)


def _pack_v4(fn: str, kv: torch.Tensor, page_stride, fnuz: bool) -> torch.Tensor:
    _check_pack_input(kv, (512,))
    num_pages, page_size, _ = kv.shape
    fmt = "fp8_ds_mla_v4_fnuz" if fnuz else "fp8_ds_mla_v4"
    cache = _alloc(fn, fmt, num_pages, page_size, None, kv.device, page_stride)
    slots = torch.arange(num_pages * page_size, device=kv.device)
    write_kv_rows(cache, fmt, slots, kv.reshape(-1, 512))
    return cache


def pack_kv_cache(kv: torch.Tensor, kv_format: str, page_stride: Optional[int] = None) -> torch.Tensor:
    """Pack ``kv [num_pages, page_size, d_qk]`` (float32/bf16) into ``kv_format``.

    ``"bf16"`` -> ``kv.to(bfloat16)`` (d_qk 576 or 512); ``"fp8_ds_mla[_fnuz]"`` ->
    :func:`pack_fp8_ds_mla` (d_qk 576); ``"fp8_ds_mla_v4[_fnuz]"`` -> :func:`pack_fp8_ds_mla_v4`
    (d_qk 512; ``page_stride`` only here, a ValueError with the other formats). Every format
    needs page_size >= 1 (as :func:`sparse_mla_decode` does). ValueError naming ``kv`` for anything
    but a floating-point tensor of that shape, or for a ``page_stride`` below ``page_size * 584``;
    TypeError for a ``page_stride`` that is not an integer.
    """
    layout, fnuz = kv_layout(kv_format), is_fnuz(kv_format)
    _check_page_stride_format("pack_kv_cache", kv_format, page_stride)
    if layout == "bf16":
        _check_pack_input(kv, (576, 512))
        return kv.to(torch.bfloat16)
    if layout == "fp8_ds_mla":
        return pack_fp8_ds_mla(kv, fnuz=fnuz)
    return _pack_v4("pack_kv_cache", kv, page_stride, fnuz)


# ----------------------------------------------------------------------------------------------
# readers
# ----------------------------------------------------------------------------------------------


def gather_kv_rows(
    kv_cache: torch.Tensor, kv_format: str, slots: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantise only the given slots of a paged KV cache.

    Args:
        kv_cache: ``[num_pages, page_size, row]`` or ``[num_pages, page_size, 1, row]`` in
            ``kv_format`` (row = d_qk bf16 elements, 656 or 584 bytes). Any page stride
            (``stride(0)``, in elements; for V4 the padded page stride in bytes) and storage offset;
            last dim contiguous; token stride (``stride(1)``) at least a row (V4: exactly 584), as
            :func:`sparse_mla_decode` requires. Not mutated.
        kv_format: one of :data:`KV_FORMATS`: ``"bf16"``, ``"fp8_ds_mla"`` (V3.2),
            ``"fp8_ds_mla_v4"`` (V4), or their ``_fnuz`` twins (e4m3fnuz value bytes).
        slots: integer ``[n]`` global slot ids, ``slot = page * page_size + offset`` with
            ``page_size = kv_cache.shape[1]``; all must lie in ``[0, num_pages * page_size)``
            (IndexError otherwise); ValueError unless 1-D. Duplicates allowed.
        dtype: result dtype (float32 default; float64 gives exact products of fp8 x scale).

    Returns:
        ``[n, d_qk]`` in ``dtype`` (d_qk 576 / 512). Only the bytes of the given slots are read.
    """
    c = _check_cache(kv_cache, kv_format)
    page, off = _split_slots(slots, c)
    layout, fnuz = _LAYOUT[kv_format], kv_format.endswith("_fnuz")
    if layout == "bf16":
        return c[page, off].to(dtype)
    if layout == "fp8_ds_mla":
        return _decode_v32_rows(c[page, off], dtype, fnuz)
    data_v, scale_v = _v4_views(c)
    return _decode_v4_rows(data_v[page, off], scale_v[page, off], dtype, fnuz)


def unpack_kv_cache(kv_cache: torch.Tensor, kv_format: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantise a whole cache: ``[num_pages, page_size, d_qk]`` in ``dtype`` (float32 default).

    Same inputs as :func:`gather_kv_rows`; every slot is read, so slots holding garbage come out
    as NaN.
    """
    c = _check_cache(kv_cache, kv_format)
    num_pages, page_size = c.shape[0], c.shape[1]
    slots = torch.arange(num_pages * page_size, device=c.device)
    rows = gather_kv_rows(kv_cache, kv_format, slots, dtype)
    return rows.reshape(num_pages, page_size, rows.shape[-1])
