"""Replay the active splits' table (thirty-fifth session) on a measured sweep of forced counts.

A mirror, in Python, of `decode_active_cost` / `decode_active_pick` / `decode_active_splits_table`
/ `decode_active_bucket` in csrc/include/mla_ext/sparse_mla_decode.h, with the cost model's
constants as arguments, so that they can be refitted to new sweeps without a GPU. Input: the
markdown table of benchmarks/RESULTS.md's thirty-fifth session, call 3 (rows `| layer:H:T | old
auto | first table | S'=1 | ... | S'=7 |`: µs per call of the C128 layers with the slots in use
forced to S' by MLA_EXT_ACTIVE_SPLITS, "-" where S' is not below the grid):

  python benchmarks/dev/active_splits_fit.py [--grid]

For each shape it takes the bucket of the rows' mean effective length (the layers' length bands
below), the table's pick for it, and prints the shapes where the pick is more than 5% off the
fastest forced S' or more than 2% slower than the old automatic count, then the geometric means
over the shapes of 72+ tokens (below, the op keeps the wave count: decode_active_applies). The mirror's
picks matched the header's table on 20,000 random (66-256 tokens, 1-16 heads, mean length) cases
when it was written; re-check it after a change to either. (Up to 256 tokens: above, the header's
grid, slot map and model differ, thirty-sixth session, and this mirror does not follow them.)
--grid ranks constant sets of a small grid (the shipped set came from it, without the split bound,
which a check on other shapes added: RESULTS.md, call 4).
"""
from __future__ import annotations

import argparse
import itertools
import math
import re
from pathlib import Path

W = 8320  # the C128 layer's index width (window 128 + 8192 compressed rows)
# Mean effective length per layer (window 128 + the band's mean; the straggler layer: one full row,
# the rest ~500 compressed rows): .dev/sweep_act.py's bands, mla_ext.bench's v4_c128(_mixed).
MEAN = {"v4_c128": 8320, "c128r1k_mixed": 1128, "c128r3k_mixed": 3128, "c128r5k_mixed": 5128,
        "c128rnd_mixed": 128 + (300 + 8192) // 2}
SMS, BUCKETS = 132, 32
# (pair fixed, pair per tile, lone fixed, extra slots per token): decode_active_cost's 1, 1.25, 1.5, 1/2
SHIPPED = (1.0, 1.25, 1.5, 0.5)
MIN_SPLIT_ROWS = 192  # kActiveMinSplitRows: splits of more than three tiles (one split always)
MIN_TOKENS = 72  # decode_active_applies on 132 processors (0.54 x)


def mean_len(layer, T):
    return MEAN.get(layer) or -(-(W + (T - 1) * 628) // T)


def grid(T):
    return min(8, 1024 // T)


def cost(T, H, L, s, c, equal_rows):
    pf, pt, lone, extra = c
    m = -(-(T * s + (0 if equal_rows else math.ceil(extra * T))) // SMS)
    n = -(-(-(-L // s)) // 64)
    return (m // 2) * (pf + pt * n) + (m % 2) * (lone + n) + 1 + T * H * s / (64 * SMS)


def pick(T, H, mean, c=SHIPPED, min_rows=MIN_SPLIT_ROWS):
    k = min(BUCKETS - 1, max(0, (mean * T - 1) * BUCKETS // (T * W)))
    upper = -(-(k + 1) * W // BUCKETS)
    costs = {s: cost(T, H, upper, s, c, k == BUCKETS - 1) for s in range(1, grid(T))
             if s == 1 or -(-upper // s) > min_rows}
    return min(costs, key=lambda s: (costs[s], s))


def read(path: Path):
    text = path.read_text(encoding="utf-8")
    start = text.find("**Call 3: the ceil map**", text.find("(thirty-fifth session)"))
    if start < 0:
        return []
    end = text.find("\n**Call", start + 10)
    rows = []
    for line in text[start:end if end > 0 else None].splitlines():
        m = re.match(r"\| (\w+):(\d+):(\d+) \| ([\d.]+) \| ([\d.]+) \| (.*) \|$", line)
        if m and m.group(1) in MEAN or (m and m.group(1) == "v4_c128_mixed"):
            forced = {i + 1: float(x) for i, x in enumerate(m.group(6).split(" | ")) if x.strip() != "-"}
            rows.append((m.group(1), int(m.group(2)), int(m.group(3)), float(m.group(4)), forced))
    return rows


def score(rows, c, show=False):
    vs_best, vs_old = [], []
    for layer, H, T, old, forced in rows:
        if T < MIN_TOKENS:  # (the op keeps the wave count there)
            continue
        p = pick(T, H, mean_len(layer, T), c)
        best = min(forced.values())
        vs_best.append(forced[p] / best)
        vs_old.append(forced[p] / old)
        if show and (forced[p] / best > 1.05 or forced[p] / old > 1.02):
            print(f"{layer}:{H}:{T}: S'={p} {forced[p]:.1f} us, fastest {best:.1f}, old {old:.1f}")
    geo = lambda r: 100 * (math.exp(sum(map(math.log, r)) / len(r)) - 1)
    return geo(vs_best), 100 * (max(vs_best) - 1), geo(vs_old), 100 * (max(vs_old) - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path(__file__).resolve().parents[1] / "RESULTS.md")
    ap.add_argument("--grid", action="store_true", help="search the constants over a small grid")
    args = ap.parse_args()
    rows = read(args.results)
    if not rows:
        raise SystemExit("no thirty-fifth-session forced-S' table found")
    print(f"{len(rows)} shapes")
    b, wb, o, wo = score(rows, SHIPPED, show=True)
    print(f"shipped constants: {b:+.2f}% vs the fastest S' (worst {wb:+.1f}%), {o:+.1f}% vs the old count (worst {wo:+.1f}%)")
    if args.grid:
        res = sorted((score(rows, c) + (c,) for c in itertools.product(
            [0.5, 1, 2, 3], [1.0, 1.25, 1.5, 1.75], [1.0, 1.5, 2.5], [0.0, 0.25, 0.5, 0.75])), key=lambda x: x[0])
        for b, wb, o, wo, c in res[:10]:
            print(f"{b:+.2f}% (worst {wb:+.1f}%) vs fastest, {o:+.1f}% (worst {wo:+.1f}%) vs old: {c}")


if __name__ == "__main__":
    main()
