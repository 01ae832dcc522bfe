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
Thirteenth session's results: benchmarks/RESULTS.md.
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
