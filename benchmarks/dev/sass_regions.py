"""Where a kernel's warps spend their time, by stretch of SASS between barriers.

Cuts one kernel's SASS (``cuobjdump -sass`` text) at its barriers, memory barriers, wgmma
waits and exits, and prints per stretch: the static instruction count, shared stores, global
loads, and, given Nsight Compute's per-instruction source counters for the same binary
(``ncu -i REP --page source --csv --print-source sass``, plain or gzipped), its share of the
warp stall samples, executed warp instructions and its three largest stall reasons. Sampled
rows are matched to the SASS by position, so both must come from the same build (checked:
the opcodes must agree).

    python3 benchmarks/dev/sass_regions.py KERNEL.sass MANGLED_NAME [SOURCE.csv[.gz]] [--min 60]
    python3 benchmarks/dev/sass_regions.py KERNEL.sass MANGLED_NAME SOURCE.csv --ranges 0-1474,1474-1614

``--ranges`` replaces the automatic cut with explicit [start, end) instruction indices (the
index printed in the first column). Used in the nineteenth and twentieth sessions
(benchmarks/NOTES.md) on the asymmetric warpgroup kernels.
"""
import argparse
import collections
import csv
import gzip
import re

CUT = re.compile(r"BAR\.|MEMBAR|WARPGROUP\.DEPBAR|HGMMA.*gsb0|EXIT")


def read_sass(path, name):
    text = (gzip.open if path.endswith(".gz") else open)(path, "rt").read()
    i = text.index("Function : " + name)
    j = text.find("Function :", i + 10)
    return re.findall(r"/\*([0-9a-f]{4,6})\*/\s+(.*?);", text[i:j if j > 0 else None])


def read_source(path):
    rows = list(csv.reader((gzip.open if path.endswith(".gz") else open)(path, "rt")))
    hdr = next(r for r in rows if "Source" in r)
    return hdr, rows[rows.index(hdr) + 1:]


def opcode(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text.strip()).split()[0].split(".")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass")
    ap.add_argument("name", help="mangled kernel name as cuobjdump prints it")
    ap.add_argument("source", nargs="?", help="Nsight Compute source-page CSV of the same binary")
    ap.add_argument("--min", type=int, default=60, help="automatic cut: merge stretches shorter than this")
    ap.add_argument("--ranges", help="explicit stretches a-b,c-d (instruction indices)")
    args = ap.parse_args()
    ins = read_sass(args.sass, args.name)
    if args.ranges:
        spans = [tuple(map(int, r.split("-"))) for r in args.ranges.split(",")]
    else:
        spans, start = [], 0
        for k, (_, t) in enumerate(ins):
            if CUT.search(t) and k + 1 - start >= args.min:
                spans.append((start, k + 1))
                start = k + 1
        spans.append((start, len(ins)))
    samples = None
    if args.source:
        hdr, rows = read_source(args.source)
        if len(rows) != len(ins) or any(opcode(ins[k][1]) not in rows[k][1] for k in range(len(ins))):
            raise SystemExit("the source counters do not match this SASS (another build?)")
        si = hdr.index("Warp Stall Sampling (All Samples)")
        ie = hdr.index("Instructions Executed")
        stalls = [k for k, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
        samples = [int(r[si] or 0) for r in rows]
        total = sum(samples) or 1
        print(f"{total} warp stall samples")
    for a, b in spans:
        body = [t for _, t in ins[a:b]]
        sts = sum("STS" in t for t in body)
        ldg = sum(bool(re.search(r"\bLDG|\bLD\.E", t)) for t in body)
        line = f"{a:5d}-{b:5d} {b - a:5d} instr, STS {sts:3d}, global loads {ldg:3d}"
        if samples is not None:
            share = 100 * sum(samples[a:b]) / total
            executed = sum(int(rows[k][ie] or 0) for k in range(a, b))
            reasons = collections.Counter()
            for k in range(a, b):
                for q in stalls:
                    reasons[hdr[q][6:]] += int(rows[k][q] or 0)
            top = ", ".join(f"{n} {100 * v / total:.1f}" for n, v in reasons.most_common(3) if v)
            line += f" | {share:5.1f}% of samples, {executed / 1e6:7.2f}M warp instr | {top}"
        print(line + f" | ends {body[-1][:48] if body else ''}")


if __name__ == "__main__":
    main()
