"""Developer harness for the sparse_mla_decode GPU kernels (not part of pytest).

Builds nothing itself: run tests/gpu_dev/build_capi.sh first (or pass --so).
Fills a ctypes mirror of mla_ext::SparseDecodeParams from torch CUDA tensors,
runs the C entry point on random inputs (3 formats x heads {1,8,16,64,128} x
tokens {1,5,64} x splits {1,3,auto} x {tensor-core, portable}) and compares with
a float64 PyTorch reference written here (DESIGN.md §4). Then times a few
DeepSeek shapes with CUDA events.

    tests/gpu_dev/build_capi.sh build/gpu_dev/libmla_ext_capi.so
    python tests/gpu_dev/decode_ctypes_check.py --so build/gpu_dev/libmla_ext_capi.so
"""
import argparse
import ctypes as C
import math
import os
import sys
import time

import torch

FMT_ID = {"bf16": 0, "fp8_ds_mla": 1, "fp8_ds_mla_v4": 2}
NAN_U8 = 0xFF


# The C structs' ctypes mirrors (one copy, shared with the CPU emulator's binding).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from simt_capi import DecodeParams as Params, KvSet  # noqa: E402


def load_lib(path):
    lib = C.CDLL(path)
    lib.mla_ext_sparse_mla_decode.restype = C.c_int
    lib.mla_ext_sparse_mla_decode.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_int, C.c_void_p]
    lib.mla_ext_sparse_mla_decode_workspace_size.restype = C.c_size_t
    lib.mla_ext_sparse_mla_decode_workspace_size.argtypes = [C.c_longlong, C.c_longlong, C.c_int]
    lib.mla_ext_sparse_mla_decode_num_splits.restype = C.c_int
    lib.mla_ext_sparse_mla_decode_num_splits.argtypes = [C.c_longlong, C.c_longlong, C.c_longlong, C.c_int]
    lib.mla_ext_sparse_mla_decode_num_splits_for.restype = C.c_int
    lib.mla_ext_sparse_mla_decode_num_splits_for.argtypes = [C.c_void_p, C.c_int]
    lib.mla_ext_sparse_decode_params_size.restype = C.c_size_t
    lib.mla_ext_status_string.restype = C.c_char_p
    lib.mla_ext_status_string.argtypes = [C.c_int]
    got = lib.mla_ext_sparse_decode_params_size()
    assert got == C.sizeof(Params), f"ctypes mirror {C.sizeof(Params)} B != C++ {got} B"
    return lib


# ----------------------------------------------------------------------------- caches
def rand_e4m3_bytes(shape, gen, dev):
    """Random e4m3fn bytes, never the NaN codes 0x7f / 0xff (gen lives on dev)."""
    r = torch.randint(0, 254, shape, generator=gen, device=dev, dtype=torch.int32)
    r = r + (r >= 127).to(torch.int32)
    return r.to(torch.uint8)


class Cache:
    """One paged cache in one format; `poison` slots hold NaN bytes."""

    def __init__(self, fmt, d_qk, num_pages, page_size, gen, dev, poison_frac=0.1, bf16_pad=16,
                 v4_extra_page_bytes=576):
        self.fmt, self.d_qk, self.num_pages, self.page_size = fmt, d_qk, num_pages, page_size
        self.num_slots = num_pages * page_size
        n = self.num_slots
        cpu_gen = gen
        gen = torch.Generator(device=dev)
        gen.manual_seed(int(torch.randint(0, 2**62, (1,), generator=cpu_gen)))
        self.poison = torch.rand(n, generator=gen, device=dev) < poison_frac
        if fmt == "bf16":
            dp = d_qk + bf16_pad  # padded token stride
            vals = (torch.randn(num_pages, page_size, dp, generator=gen, device=dev) * 0.5).to(torch.bfloat16)
            vals.view(n, dp)[self.poison] = float("nan")
            self.store = vals
            self.ptr = vals.data_ptr()
            self.page_stride = page_size * dp * 2
            self.token_stride = dp * 2
        elif fmt == "fp8_ds_mla":
            b = torch.empty(num_pages, page_size, 656, dtype=torch.uint8, device=dev)
            b[..., :512] = rand_e4m3_bytes((num_pages, page_size, 512), gen, dev)
            sc = (torch.rand(num_pages, page_size, 4, generator=gen, device=dev) * 1.5 + 0.25) / 448.0
            b[..., 512:528] = sc.view(torch.uint8).view(num_pages, page_size, 16)
            rope = (torch.randn(num_pages, page_size, 64, generator=gen, device=dev) * 0.5).to(torch.bfloat16)
            b[..., 528:] = rope.view(torch.uint8).view(num_pages, page_size, 128)
            b.view(n, 656)[self.poison] = NAN_U8
            self.store = b
            self.ptr = b.data_ptr()
            self.page_stride = page_size * 656
            self.token_stride = 656
        else:
            ps = page_size
            stride = ps * 584
            stride = ((stride + v4_extra_page_bytes - 1) // 576) * 576  # padded like engines do
            b = torch.empty(num_pages, stride, dtype=torch.uint8, device=dev)
            b.fill_(NAN_U8)
            data = b[:, : ps * 576].view(num_pages, ps, 576)
            data[..., :448] = rand_e4m3_bytes((num_pages, ps, 448), gen, dev)
            rope = (torch.randn(num_pages, ps, 64, generator=gen, device=dev) * 0.5).to(torch.bfloat16)
            data[..., 448:] = rope.view(torch.uint8).view(num_pages, ps, 128)
            scl = b[:, ps * 576: ps * 576 + ps * 8].view(num_pages, ps, 8)
            e = torch.randint(127 - 11, 127 - 5, (num_pages, ps, 7), generator=gen, device=dev, dtype=torch.int32)
            scl[..., :7] = e.to(torch.uint8)
            scl[..., 7] = 0
            pz = self.poison.view(num_pages, ps)
            data[pz] = NAN_U8
            scl[pz] = NAN_U8
            self.store = b
            self.ptr = b.data_ptr()
            self.page_stride = stride
            self.token_stride = 584

    def rows_f64(self, slots):
        """Dequantise the rows of `slots` (1-D long, all valid) to float64 [n, d_qk]."""
        page = slots // self.page_size
        off = slots % self.page_size
        if self.fmt == "bf16":
            return self.store[page, off, : self.d_qk].double()
        if self.fmt == "fp8_ds_mla":
            r = self.store[page, off]
            lat = r[:, :512].contiguous().view(torch.float8_e4m3fn).double()
            sc = r[:, 512:528].contiguous().view(torch.float32).double()
            lat = lat * sc.repeat_interleave(128, dim=1)
            rope = r[:, 528:].contiguous().view(torch.bfloat16).double()
            return torch.cat([lat, rope], dim=1)
        ps = self.page_size
        cols = off[:, None] * 576 + torch.arange(576, device=slots.device)[None]
        d = self.store[page[:, None], cols]
        scols = ps * 576 + off[:, None] * 8 + torch.arange(7, device=slots.device)[None]
        sb = self.store[page[:, None], scols].double()
        sc = torch.exp2(sb - 127.0)
        lat = d[:, :448].contiguous().view(torch.float8_e4m3fn).double() * sc.repeat_interleave(64, dim=1)
        rope = d[:, 448:].contiguous().view(torch.bfloat16).double()
        return torch.cat([lat, rope], dim=1)

    def kvset(self, indices, lengths):
        s = KvSet()
        s.cache = self.ptr
        s.page_stride_bytes = self.page_stride
        s.token_stride_bytes = self.token_stride
        s.page_size = self.page_size
        s.num_slots = self.num_slots
        s.indices = indices.data_ptr()
        s.indices_stride_token = indices.stride(0)
        s.width = indices.shape[1]
        s.lengths = lengths.data_ptr() if lengths is not None else None
        s.lengths_stride = lengths.stride(0) if lengths is not None else 1
        return s


def make_indices(cache, T, W, gen, dev, with_lengths, empty_tokens=()):
    """Indices [T, W] mixing valid slots, -1, >= num_slots; positions past lengths
    point at NaN-poisoned slots (must never be read)."""
    good = (~cache.poison).nonzero().flatten().cpu()
    bad = cache.poison.nonzero().flatten().cpu()
    pick = good[torch.randint(0, len(good), (T, W), generator=gen)]
    u = torch.rand(T, W, generator=gen)
    pick[u < 0.08] = -1
    pick[(u >= 0.08) & (u < 0.12)] = cache.num_slots + 3
    lengths = None
    if with_lengths:
        lengths = torch.randint(0, W + 8, (T,), generator=gen, dtype=torch.int32)
        for t in range(T):
            L = int(lengths[t])
            if L < W and len(bad) > 0:
                pick[t, L:] = bad[torch.randint(0, len(bad), (W - L,), generator=gen)]
    for t in empty_tokens:
        pick[t] = -1
    idx = pick.to(torch.int32).to(dev)
    return idx, (lengths.to(dev) if lengths is not None else None)


def valid_slots(cache, idx_row, length):
    W = idx_row.shape[0]
    n = W if length is None else max(0, min(W, int(length)))
    r = idx_row[:n].long()
    return r[(r >= 0) & (r < cache.num_slots)]


def reference(q, sets, scale, sink):
    """float64 reference. sets: list of (cache, indices, lengths). Returns out [T,H,512], lse [T,H]."""
    T, H, d = q.shape
    out = torch.zeros(T, H, 512, dtype=torch.float64, device=q.device)
    lse = torch.full((T, H), -math.inf, dtype=torch.float64, device=q.device)
    qd = q.double()
    for t in range(T):
        rows = []
        for cache, idx, lens in sets:
            sl = valid_slots(cache, idx[t], None if lens is None else lens[t])
            if sl.numel():
                rows.append(cache.rows_f64(sl))
        if not rows:
            continue
        K = torch.cat(rows, 0)
        s = scale * (qd[t] @ K.T)  # [H, n]
        m = s.max(dim=1).values
        e = torch.exp(s - m[:, None])
        l = e.sum(dim=1)
        D = l.clone()
        if sink is not None:
            D = l + torch.exp(sink.double() - m)
        out[t] = (e @ K[:, :512]) / D[:, None]
        lse[t] = m + torch.log(l)
    return out, lse


# ----------------------------------------------------------------------------- runner
class Runner:
    def __init__(self, lib, num_sms):
        self.lib, self.num_sms = lib, num_sms

    def prepare(self, fmt, d_qk, q, sets, scale, sink, splits, portable, out_view, lse_view):
        T, H, _ = q.shape
        p = Params()
        p.kv_format = FMT_ID[fmt]
        p.d_qk = d_qk
        p.num_tokens, p.num_heads = T, H
        p.softmax_scale = scale
        p.q = q.data_ptr()
        p.q_stride_token, p.q_stride_head = q.stride(0), q.stride(1)
        p.main = sets[0][0].kvset(sets[0][1], sets[0][2])
        if len(sets) > 1:
            p.extra = sets[1][0].kvset(sets[1][1], sets[1][2])
        p.attn_sink = sink.data_ptr() if sink is not None else None
        p.attn_sink_stride = sink.stride(0) if sink is not None else 1
        p.output = out_view.data_ptr()
        p.output_stride_token, p.output_stride_head = out_view.stride(0), out_view.stride(1)
        p.lse = lse_view.data_ptr() if lse_view is not None else None
        if lse_view is not None:
            p.lse_stride_token, p.lse_stride_head = lse_view.stride(0), lse_view.stride(1)
        p.force_portable = portable
        # "auto": num_splits = 0, resolved by the decode itself; its count (for the workspace and
        # the report) from mla_ext_sparse_mla_decode_num_splits_for
        p.num_splits = 0 if splits == "auto" else splits
        S = self.lib.mla_ext_sparse_mla_decode_num_splits_for(C.byref(p), self.num_sms)
        assert S >= 1, "mla_ext_sparse_mla_decode_num_splits_for refused the call"
        ws_bytes = self.lib.mla_ext_sparse_mla_decode_workspace_size(T, H, S)
        ws = torch.full((max(ws_bytes, 4) // 4,), float("nan"), dtype=torch.float32, device=q.device)
        return p, ws, ws_bytes, S

    def launch(self, p, ws, ws_bytes):
        st = self.lib.mla_ext_sparse_mla_decode(C.byref(p), ws.data_ptr(), ws_bytes, self.num_sms,
                                                torch.cuda.current_stream().cuda_stream)
        if st != 0:
            raise RuntimeError(f"mla_ext_sparse_mla_decode: {self.lib.mla_ext_status_string(st).decode()}")


def check(args, lib, dev):
    gen = torch.Generator().manual_seed(1234)
    runner = Runner(lib, torch.cuda.get_device_properties(dev).multi_processor_count)
    rows = []
    worst = 0.0
    fails = 0
    formats = [("bf16", 576), ("bf16", 512), ("fp8_ds_mla", 576), ("fp8_ds_mla_v4", 512)]
    for fmt, d_qk in formats:
        for H in args.heads:
            for T in args.tokens:
                main = Cache(fmt, d_qk, num_pages=24, page_size=64 if fmt != "fp8_ds_mla_v4" else 256, gen=gen, dev=dev)
                midx, mlen = make_indices(main, T, 160, gen, dev, with_lengths=(T != 1),
                                          empty_tokens=(0,) if T > 1 else ())
                sets = [(main, midx, mlen)]
                if T != 5:
                    ps = 2 if (H % 2 == 0) else 64
                    extra = Cache(fmt, d_qk, num_pages=max(4, 600 // ps), page_size=ps, gen=gen, dev=dev)
                    eidx, elen = make_indices(extra, T, 300, gen, dev, with_lengths=True,
                                              empty_tokens=(0,) if T > 1 else ())
                    sets.append((extra, eidx, elen))
                q = (torch.randn(T, H + 2, d_qk, generator=gen) * 2.0).to(torch.bfloat16).to(dev)[:, 1:H + 1]
                scale = d_qk ** -0.5
                sink = None
                if fmt != "fp8_ds_mla":
                    sink = torch.randn(H, generator=gen).to(dev)
                    if H >= 4:
                        sink[1] = -math.inf
                        sink[2] = math.inf
                ref_o, ref_l = reference(q, sets, scale, sink)
                for splits in args.splits:
                    for portable in (False, True):
                        obuf = torch.full((T, H + 3, 576), float("nan"), dtype=torch.bfloat16, device=dev)
                        out = obuf[:, 2:H + 2, 32:544]
                        lbuf = torch.full((H, T), float("nan"), dtype=torch.float32, device=dev)
                        lse = lbuf.T
                        p, ws, wsb, S = runner.prepare(fmt, d_qk, q, sets, scale, sink, splits, portable, out, lse)
                        runner.launch(p, ws, wsb)
                        torch.cuda.synchronize()
                        o = out.double()
                        denom = max(ref_o.abs().max().item(), 1e-6)
                        err = ((o - ref_o).abs().max().item()) / denom
                        if torch.isnan(o).any():
                            err = float("inf")
                        l = lse.double()
                        both_inf = (l == -math.inf) & (ref_l == -math.inf)
                        le = torch.where(both_inf, torch.zeros_like(l), (l - ref_l).abs() / (1 + ref_l.abs()))
                        lerr = le.max().item() if not torch.isnan(le).any() else float("inf")
                        ok = err < args.tol and lerr < args.tol
                        fails += not ok
                        worst = max(worst, err)
                        rows.append((fmt, d_qk, H, T, S, "portable" if portable else "mma", err, lerr, ok))
                        if not ok or args.verbose:
                            print(f"{'FAIL' if not ok else 'ok  '} {fmt:14s} d={d_qk} H={H:3d} T={T:2d} S={S:2d} "
                                  f"{'portable' if portable else 'mma':8s} out_err={err:.2e} lse_err={lerr:.2e}",
                                  flush=True)
    # summary table: worst error per (format, path)
    print("\ncorrectness summary (max rel err = max|out-ref| / max|ref|; lse err = |d|/(1+|ref|))")
    print(f"{'format':14s} {'d_qk':>4s} {'path':8s} {'cases':>5s} {'max out err':>11s} {'max lse err':>11s} {'fails':>5s}")
    keys = sorted({(r[0], r[1], r[5]) for r in rows})
    for k in keys:
        rs = [r for r in rows if (r[0], r[1], r[5]) == k]
        print(f"{k[0]:14s} {k[1]:4d} {k[2]:8s} {len(rs):5d} {max(r[6] for r in rs):11.2e} "
              f"{max(r[7] for r in rs):11.2e} {sum(not r[8] for r in rs):5d}")
    print(f"TOTAL cases={len(rows)} fails={fails}")
    return fails


def big_offset_check(lib, dev):
    """A > 2 GiB fp8_ds_mla_v4 cache with rows selected from its last pages."""
    gen = torch.Generator().manual_seed(7)
    runner = Runner(lib, torch.cuda.get_device_properties(dev).multi_processor_count)
    ps = 64
    stride = ((ps * 584 + 575) // 576) * 576
    num_pages = (2**31 + 2**29) // stride + 8
    store = torch.zeros(num_pages, stride, dtype=torch.uint8, device=dev)
    small = Cache("fp8_ds_mla_v4", 512, num_pages=8, page_size=ps, gen=gen, dev=dev, poison_frac=0.0)
    store[-8:] = small.store  # same stride
    big = Cache.__new__(Cache)
    big.__dict__.update(small.__dict__)
    big.store, big.ptr, big.num_pages = store, store.data_ptr(), num_pages
    big.num_slots = num_pages * ps
    big.poison = torch.zeros(big.num_slots, dtype=torch.bool, device=dev)
    T, H = 3, 16
    slots = torch.randint(0, 8 * ps, (T, 200), generator=gen) + (num_pages - 8) * ps
    idx = slots.to(torch.int32).to(dev)
    q = (torch.randn(T, H, 512, generator=gen)).to(torch.bfloat16).to(dev)
    sets = [(big, idx, None)]
    ref_o, ref_l = reference(q, sets, 512 ** -0.5, None)
    out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(T, H, dtype=torch.float32, device=dev)
    errs = []
    for portable in (False, True):
        p, ws, wsb, S = runner.prepare("fp8_ds_mla_v4", 512, q, sets, 512 ** -0.5, None, 3, portable, out, lse)
        runner.launch(p, ws, wsb)
        torch.cuda.synchronize()
        errs.append((out.double() - ref_o).abs().max().item() / ref_o.abs().max().item())
    del store
    torch.cuda.empty_cache()
    print(f"big-offset (cache {num_pages * stride / 2**30:.2f} GiB, rows in last pages): "
          f"mma err {errs[0]:.2e}, portable err {errs[1]:.2e}")
    return sum(e > 1e-2 for e in errs)


def nan_code_check(lib, dev):
    """A selected, valid row holding the e4m3 NaN code (0x7f / 0xff) must give NaN
    output (numerics.h decodes them to NaN; the CPU twin does too)."""
    gen = torch.Generator().manual_seed(11)
    runner = Runner(lib, torch.cuda.get_device_properties(dev).multi_processor_count)
    bad = 0
    for fmt, d_qk, ps in (("fp8_ds_mla", 576, 64), ("fp8_ds_mla_v4", 512, 64)):
        for code in (0x7F, 0xFF):
            cache = Cache(fmt, d_qk, num_pages=4, page_size=ps, gen=gen, dev=dev, poison_frac=0.0)
            slot = 5
            if fmt == "fp8_ds_mla":
                cache.store[slot // ps, slot % ps, 3] = code
            else:
                cache.store[slot // ps, (slot % ps) * 576 + 3] = code
            idx = torch.tensor([[1, 2, slot, 7, 9]], dtype=torch.int32, device=dev)
            q = torch.randn(1, 8, d_qk, generator=gen).to(torch.bfloat16).to(dev)
            out = torch.zeros(1, 8, 512, dtype=torch.bfloat16, device=dev)
            for portable in (False, True):
                out.zero_()
                p, ws, wsb, S = runner.prepare(fmt, d_qk, q, [(cache, idx, None)], d_qk ** -0.5, None, 1,
                                               portable, out, None)
                runner.launch(p, ws, wsb)
                torch.cuda.synchronize()
                ok = bool(torch.isnan(out.float()).any())
                bad += not ok
                print(f"nan-code {fmt:14s} 0x{code:02x} {'portable' if portable else 'mma':8s}: "
                      f"{'NaN ok' if ok else 'FAIL (finite output)'}")
    return bad


def links_shared_cuda_runtime(path: str) -> bool:
    """Whether the library at ``path`` names the shared CUDA runtime (a DT_NEEDED libcudart.so.N),
    i.e. shares the process's runtime instance and its last-error slot; nvcc's default links a
    static, private one."""
    with open(path, "rb") as f:
        return b"libcudart.so" in f.read()


def runtime_state_check(lib, dev):
    """Through the C API: (1) a smem_limit far above the device's per-block maximum counts as that
    maximum (the call runs, bit-identical to smem_limit 0); (2) a runtime error the caller left
    pending before the call is neither reported as the launch's failure nor cleared, with one
    split (one kernel) and with three (split kernel + reduce). (2) needs the library linked to the
    shared runtime that torch loaded (build_capi.sh does so since the twenty-seventh session; a
    statically linked runtime is a separate instance whose last-error slot the check cannot set),
    and is skipped otherwise."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: conftest
    from conftest import loaded_cuda_runtime

    cudart = loaded_cuda_runtime() if links_shared_cuda_runtime(lib._name) else None
    if cudart is None:
        print("runtime state: the library does not link the shared CUDA runtime; pending-error cases skipped")
    gen = torch.Generator().manual_seed(5)
    runner = Runner(lib, torch.cuda.get_device_properties(dev).multi_processor_count)
    cache = Cache("fp8_ds_mla_v4", 512, num_pages=16, page_size=64, gen=gen, dev=dev, poison_frac=0.0)
    idx = torch.randperm(cache.num_slots, generator=gen)[: 3 * 200].view(3, 200).to(torch.int32).to(dev)
    bad = 0
    for H in (16, 128):
        q = torch.randn(3, H, 512, generator=gen).to(torch.bfloat16).to(dev)
        for S in (1, 3):
            outs = []
            for limit, pending in ((0, False), (1 << 40, False)) + (((0, True),) if cudart else ()):
                out = torch.full((3, H, 512), float("nan"), dtype=torch.bfloat16, device=dev)
                p, ws, wsb, _ = runner.prepare("fp8_ds_mla_v4", 512, q, [(cache, idx, None)], 0.06, None, S,
                                               False, out, None)
                p.smem_limit = limit
                torch.cuda.synchronize()
                err = cudart.cudaSetDevice(1 << 20) if pending else 0
                st = lib.mla_ext_sparse_mla_decode(C.byref(p), ws.data_ptr(), wsb, runner.num_sms,
                                                   torch.cuda.current_stream().cuda_stream)
                still = cudart.cudaPeekAtLastError() if pending else 0
                if pending:
                    cudart.cudaGetLastError()
                torch.cuda.synchronize()
                ok = st == 0 and still == err and not torch.isnan(out.float()).any()
                bad += not ok
                outs.append(out)
                print(f"runtime state H={H:3d} S={S} smem_limit={limit} pending={pending} (err {err}): "
                      f"status {st}, pending after {still}: {'ok' if ok else 'FAIL'}")
            same = all(torch.equal(outs[0], o) for o in outs[1:])
            bad += not same
            print(f"runtime state H={H:3d} S={S}: results bit-identical: {same}")
    return bad


# ----------------------------------------------------------------------------- timing
def bench(lib, dev, reps=50, heads=(16, 64, 128), tokens=(1, 64), paths=(False, True), splits="auto"):
    gen = torch.Generator().manual_seed(99)
    nsm = torch.cuda.get_device_properties(dev).multi_processor_count
    runner = Runner(lib, nsm)
    shapes = []
    for H in heads:
        for T in tokens:
            shapes.append(("V4-C4 topk512", "fp8_ds_mla_v4", 512, H, T, [(128, 256), (512, 64)], True))
            shapes.append(("V4-C4 topk1024", "fp8_ds_mla_v4", 512, H, T, [(128, 256), (1024, 64)], True))
            shapes.append(("V4-C128 8192", "fp8_ds_mla_v4", 512, H, T, [(128, 256), (8192, 2)], True))
            shapes.append(("V3.2 2048", "fp8_ds_mla", 576, H, T, [(2048, 64)], False))
    print(f"\ntiming (median of {reps} CUDA-graph replays of 10 launches, CUDA events; rows disjoint per token, caches >> L2)")
    print(f"{'shape':16s} {'H':>3s} {'T':>3s} {'path':8s} {'S':>3s} {'us':>8s} {'GB/s':>7s} {'TFLOP/s':>7s}")
    results = []
    for name, fmt, d_qk, H, T, setdefs, with_sink in shapes:
        sets = []
        rows_total = 0
        row_bytes = 584 if fmt == "fp8_ds_mla_v4" else 656
        for W, ps in setdefs:
            num_pages = (T * W * 5 // 4 + ps - 1) // ps + 1
            cache = Cache(fmt, d_qk, num_pages=num_pages, page_size=ps, gen=gen, dev=dev, poison_frac=0.0)
            perm = torch.randperm(cache.num_slots, generator=gen)[: T * W].view(T, W)
            sets.append((cache, perm.to(torch.int32).to(dev), None))
            rows_total += T * W
        q = torch.randn(T, H, d_qk, generator=gen).to(torch.bfloat16).to(dev)
        sink = torch.randn(H, generator=gen).to(dev) if with_sink else None
        out = torch.empty(T, H, 512, dtype=torch.bfloat16, device=dev)
        lse = torch.empty(T, H, dtype=torch.float32, device=dev)
        for portable in paths:
            p, ws, wsb, S = runner.prepare(fmt, d_qk, q, sets, d_qk ** -0.5, sink, splits, portable, out, lse)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    runner.launch(p, ws, wsb)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            # CUDA graph of `per` back-to-back launches: host launch cost is not timed.
            per = 10
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(per):
                    runner.launch(p, ws, wsb)
            graph.replay()
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record()
                graph.replay()
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3 / per)
            del graph
            us = sorted(times)[len(times) // 2]
            gbs = rows_total * row_bytes / (us * 1e-6) / 1e9
            tfl = rows_total * 2 * H * (d_qk + 512) / (us * 1e-6) / 1e12
            path = "portable" if portable else "mma"
            results.append((name, H, T, path, S, us, gbs, tfl))
            print(f"{name:16s} {H:3d} {T:3d} {path:8s} {S:3d} {us:8.1f} {gbs:7.0f} {tfl:7.1f}", flush=True)
        del sets
        torch.cuda.empty_cache()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--so", default="build/gpu_dev/libmla_ext_capi.so")
    ap.add_argument("--heads", type=int, nargs="*", default=[1, 8, 16, 64, 128])
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 5, 64])
    ap.add_argument("--splits", nargs="*", default=["1", "3", "auto"])
    ap.add_argument("--tol", type=float, default=1e-2)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--bench-heads", type=int, nargs="*", default=[16, 64, 128])
    ap.add_argument("--bench-tokens", type=int, nargs="*", default=[1, 64])
    ap.add_argument("--bench-mma-only", action="store_true")
    ap.add_argument("--bench-splits", default="auto", help="'auto' or a fixed split count for the timing table")
    args = ap.parse_args()
    args.splits = [s if s == "auto" else int(s) for s in args.splits]
    dev = torch.device("cuda")
    lib = load_lib(args.so)
    fails = 0
    if not args.no_check:
        t0 = time.time()
        fails += check(args, lib, dev)
        fails += big_offset_check(lib, dev)
        fails += nan_code_check(lib, dev)
        fails += runtime_state_check(lib, dev)
        print(f"checks took {time.time() - t0:.1f} s")
    if not args.no_bench:
        bench(lib, dev, args.reps, args.bench_heads, args.bench_tokens,
              (False,) if args.bench_mma_only else (False, True),
              args.bench_splits if args.bench_splits == "auto" else int(args.bench_splits))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
