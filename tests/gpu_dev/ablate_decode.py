"""Timing-only ablations of the decode split kernel: rewrites the kernel header in place so that
a rebuilt extension skips one part of the per-tile chain. The results are wrong on purpose; only
the benchmark's times mean anything. Restore the header with `git checkout` afterwards.

Usage (GPU machine, repository root):
  python3 tests/gpu_dev/ablate_decode.py nogather csrc/include/mla_ext/sparse_mla_decode.cuh
  pip install --no-build-isolation --no-deps -e . && python3 benchmarks/bench_decode.py ...
Kinds:
  nogather    the 64-head warpgroup kernel without its raw loads, dequantisation and K stores
              (index loads, Q.K, softmax and P.V kept)
  nomath      the same kernel without its wgmma products
  noproducer  the pipelined kernel of 5302709 (`git show 5302709:csrc/include/mla_ext/
              sparse_mla_decode.cuh`, with that commit's compat.h) whose producer only hands the
              stages over: the consumers' time with an infinitely fast producer
  (fourteenth session, the 16-head mma.sync kernel; the first two act on every kernel)
  l2rows      every row index folded into 64 slots: the gather reads cached lines, not DRAM
  nodequant   FP8 bytes stored as they are (no conversion arithmetic)
  nogather16  no raw loads, conversion or K stores in the mma.sync kernels
  nomath16    no mma.sync products (the 16-head tile's half-K Q.K and every P.V)
  nobar       no block barrier after P.V (racy)
Thirteenth and fourteenth sessions' results: benchmarks/RESULTS.md.
"""
import sys

REPLACEMENTS = {
    "nogather": [
        ("    g.load(meta_d, meta_s, tid);\n", "\n"),
        ("      g.load(meta_d + nxt * BN, meta_s + nxt * BN, tid);\n", "\n"),
        ("      g.template store_swizzled<kWholeK>(Ks, ksc, tid, live);\n", "\n"),
    ],
    "nomath": [
        ("""          wgmma_m64n64k16(s2, wg_desc(qs0 + uint32_t((kk >> 2) * HTp * 128) + off, 16, 1024),
                          wg_desc(ks0 + uint32_t((kk >> 2) * BN * 128) + off, 16, 1024));""", "(void)off;"),
        ("""          wgmma_m64n256k16_bt(*reinterpret_cast<float(*)[128]>(acc), wg_desc(pb0 + uint32_t(kk * 32), 16, 1024),
                              wg_desc(vb0 + uint32_t(kk * 16 * 128), uint32_t(BN * 128), 1024));""", ""),
    ],
    "l2rows": [
        ("  if (idx < 0 || int64_t(idx) >= set.num_slots) return;\n",
         "  if (idx < 0 || int64_t(idx) >= set.num_slots) return;\n  idx &= 63;\n"),
    ],
    "nodequant": [
        ("""    dequant4<kFnuz, !kScaled>(raw[k].x, sc, lo.x, lo.y);
    dequant4<kFnuz, !kScaled>(raw[k].y, sc, lo.z, lo.w);
    dequant4<kFnuz, !kScaled>(raw[k].z, sc, hi.x, hi.y);
    dequant4<kFnuz, !kScaled>(raw[k].w, sc, hi.z, hi.w);""", "    (void)sc; lo = raw[k]; hi = raw[k];"),
    ],
    "nogather16": [
        ("    g.load(meta_d, meta_s, tid);\n", "\n"),
        ("      g.load(meta_d + nxt * BN, meta_s + nxt * BN, tid);\n", "\n"),
        ("      g.template store<kSkipRows>(Ks, KST, ksc, tid, live);\n", "\n"),
    ],
    "nomath16": [
        ("""          mma16816(c2[0], af, bf[0], bf[1]);
          mma16816(c2[1], af, bf[2], bf[3]);""", ""),
        ("""            mma16816(*reinterpret_cast<float(*)[4]>(acc + (m * 8 + 2 * np) * 4), af[m], bf[0], bf[1]);
            mma16816(*reinterpret_cast<float(*)[4]>(acc + (m * 8 + 2 * np + 1) * 4), af[m], bf[2], bf[3]);""", ""),
    ],
    "nobar": [
        ("    __syncthreads();  // K, S/P free for the next tile\n", "\n"),
    ],
    "noproducer": [
        ("      g.template store_swizzled<true>(Kst, nullptr, ptid, live, 0);\n", "\n"),
        ("      g.load(meta_d + cur * BN + BN / 2, meta_s + cur * BN + BN / 2, ptid);\n", "\n"),
        ("      g.template store_swizzled<true>(Kst, nullptr, ptid, live, BN / 2);\n", "\n"),
        ("        g.load(meta_d + nxt * BN, meta_s + nxt * BN, ptid);\n", "\n"),
        ("      g.load(meta_d, meta_s, ptid);\n", "\n"),
    ],
}


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in REPLACEMENTS:
        raise SystemExit(__doc__)
    kind, path = sys.argv[1], sys.argv[2]
    text = open(path).read()
    for old, new in REPLACEMENTS[kind]:
        if old not in text:
            raise SystemExit(f"ablate_decode: {kind}: this header does not contain the expected code:\n{old}")
        text = text.replace(old, new)
    open(path, "w").write(text)
    print(f"ablate_decode: {kind} applied to {path}")


if __name__ == "__main__":
    main()
