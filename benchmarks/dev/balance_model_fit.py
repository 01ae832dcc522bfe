"""Replay the decode split policy's balance model on measured split sweeps (thirty-fourth session).

A mirror, in Python, of `decode_split_cost` / `decode_balance_splits` /
`decode_launch_head_tile` in csrc/include/mla_ext/sparse_mla_decode.h, with the model's
constants as arguments, so that they can be refitted to new sweeps without a GPU. Input: the
markdown split-sweep tables of benchmarks/RESULTS.md (rows `| layer | H | T | rows | auto | S=1 |
...`, as `tests/gpu_dev/splits_sweep.py` measures them), from one section:

  python benchmarks/dev/balance_model_fit.py --section "thirty-fourth session" [--grid]

For each shape it picks the count as the policy would from the measured counts and the wave
count (the count before the model, mirrored from `decode_wave_splits`; the sweep's "auto" column
is its time when the sweep ran before the model, as in the thirty-fourth session), prints the
shapes where the pick is more than 2% off the fastest measured count, and a summary: geometric
mean and worst of (time at the pick / fastest), for the model and for "auto". --grid ranks
constant sets of a small grid by the same geometric mean (on the thirty-fourth session's table
the top sets and the shipped ones are 4.7% and 5.3%, within that sweep's noise; the shipped ones
came from an unrestricted fit and the two checks on other shapes in RESULTS.md). Layers: the
widths of mla_ext.bench.DECODE_LAYERS' kinds (window 128, C4 Flash 640, C4 Pro 1152, V3.2 2048,
C128 8320). It replays choices among measured counts only. The mirror matched the header's
decode_wave_splits and decode_num_splits (GPU) on 201,344 cases (T 1-600, 13 head counts, 16
widths from 257 to 20000, 4 processor counts) when it was written; re-check it after a policy
change.
"""
from __future__ import annotations

import argparse
import itertools
import math
import re
from fractions import Fraction
from pathlib import Path

from tabulate import tabulate

WIDTHS = {"v4_swa": 128, "v4_c4_flash": 640, "v4_c4_pro": 1152, "v32": 2048, "v4_c128": 8320,
          "v4_c128_mixed": 8320}
# (lone 16-head block fixed, pair fixed, pair per tile, reduce fixed, wide-tile fixed, reduce per
# T*H*S / (64 processors)), in units of a lone 16-head block's time per 64-entry tile; the
# header's integer form is these x 128 x processors.
SHIPPED = (1.5, 1.0, 1.5, 1.0, 2.0, 1.0)


def _cdiv(a, b):
    return -(-a // b)


def _head_groups(H):
    return _cdiv(H, min(H, 64))


def _round_splits(s, W, limit):
    """decode_round_splits."""
    per = _cdiv(W, s)
    if per > 64:
        steps = _cdiv(per, 64)
        s2 = _cdiv(W, (steps - 1) * 64)
        if s2 <= limit:
            return s2
    return s


def _floor(s, T, H, W):
    """decode_two_split_floor."""
    return 2 if s < 2 and H > 0 and W >= 4096 and 2 <= T <= 256 else s


def _base_splits(T, H, sms):
    return max(1, min(2 * sms // T // _head_groups(H), 64))


def wave_splits(T, H, W, sms):
    """decode_wave_splits for a V4 FP8 call with lengths (its two-split floor from 4096 entries at
    2..256 tokens; the balanced map itself reaches 512 since the thirty-sixth session), as the op
    and the C API's query decide it."""
    bal = 2 <= T <= 256 and W >= 4096
    base = _base_splits(T, H, sms)
    cap = max(base, min(base + base // 8, sms // T // _head_groups(H)))
    cap = _floor(cap, T, H, 4096) if bal else cap
    by_width = _cdiv(W, 32)
    if by_width > 32:
        by_width = max(_cdiv(W, 64), 32)
    big = min(H, 64)
    if big > 16:
        ht = 16
        while True:
            last = ht >= big
            one_wave = sms // T // _cdiv(H, ht)
            s = min(max(one_wave, 1), 64, by_width)
            if ht > 16:
                s = min(s, max(_cdiv(W, 64), 1))
            if not last and (s > one_wave or _cdiv(W, s) > (64 if ht == 16 else 160)):
                ht *= 2
                continue
            r = _round_splits(s, W, min(one_wave, s + s // 8))
            return min(_floor(r, T, H, W) if bal else r, cap)
    s = _round_splits(min(base, by_width), W, cap)
    return _floor(s, T, H, W) if bal else s


def launch_head_tile(T, H, S, sms):
    big = min(H, 64)
    ht = 16
    while ht < big:
        if T * math.ceil(H / ht) * S <= sms:
            return ht
        ht *= 2
    return big


def split_cost(T, H, W, S, sms, c=SHIPPED):
    """decode_split_cost in exact rationals (the header's integers / (128 x processors)), so that
    ties at the margin come out as there."""
    lone, pair_fixed, pair_tile, red, wide, red_cell = (Fraction(str(x)) for x in c)
    ht = launch_head_tile(T, H, S, sms)
    m = math.ceil(T * math.ceil(H / ht) * S / sms)
    n = math.ceil(math.ceil(W / S) / 64)
    t = (m // 2) * (pair_fixed + pair_tile * n) + (m % 2) * (lone + n) if ht <= 16 else m * (wide + n)
    return t + (red + red_cell * Fraction(T * H * S, 64 * sms) if S > 1 else 0)


def applies(T, H, W, sms):
    """decode_balance_applies."""
    max_ts = 1024 if H <= 16 else 512
    return (0 < T <= max_ts // 2 and 256 < W < 4096 and (H <= 16 or W >= 2048) and T * 10 >= sms * 3)


def pick(T, H, W, sms, wave, measured, c=SHIPPED, margin=8):
    """decode_balance_splits over the counts in `measured` (the wave count `wave` among them)."""
    if not applies(T, H, W, sms):
        return wave
    max_s, max_ts = (8, 1024) if H <= 16 else (4, 512)
    tile = launch_head_tile(T, H, wave, sms)
    wave_cost = split_cost(T, H, W, wave, sms, c)
    best, best_cost = wave, wave_cost
    for s in sorted(measured):
        if s < 1 or s > max_s or T * s > max_ts or s > _cdiv(W, 32) or launch_head_tile(T, H, s, sms) != tile:
            continue
        cost = split_cost(T, H, W, s, sms, c)
        if cost < best_cost:
            best, best_cost = s, cost
    return best if best_cost * 100 < wave_cost * (100 - margin) else wave


def read_sweeps(path: Path, section: str):
    """Rows (layer, H, T, auto µs, {S: µs}) of the split-sweep tables in the RESULTS.md section
    whose heading contains `section`."""
    text = path.read_text(encoding="utf-8")
    start = text.find(section)
    if start < 0:
        raise SystemExit(f"no section {section!r} in {path}")
    end = text.find("\n### ", start)
    rows, header = [], None
    for line in text[start:end if end > 0 else None].splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if not cells:
            header = None
            continue
        if cells[:5] == ["layer", "H", "T", "rows", "auto"]:
            header = [int(h[2:]) if re.fullmatch(r"S=\d+", h) else h for h in cells]
        elif header and cells[0] in WIDTHS and len(cells) == len(header):
            times = {h: float(v) for h, v in zip(header, cells) if isinstance(h, int)}
            rows.append((cells[0], int(cells[1]), int(cells[2]), float(cells[4]), times))
    return rows


def score(rows, sms, c, margin):
    ratios, auto_ratios, off = [], [], []
    for layer, H, T, auto_us, times in rows:
        W, best = WIDTHS[layer], min(times.values())
        wave = wave_splits(T, H, W, sms)
        s = pick(T, H, W, sms, wave, times, c, margin)
        if s not in times:  # (a wave count the sweep did not measure: its time is the auto column's)
            times = {**times, s: auto_us}
        ratios.append(times[s] / best)
        auto_ratios.append(auto_us / best)
        if times[s] / best > 1.02:
            off.append([layer, H, T, s, times[s], auto_us, best, f"{100 * (times[s] / best - 1):+.1f}%"])
    geo = lambda r: math.exp(sum(map(math.log, r)) / len(r)) - 1
    return geo(ratios), max(ratios) - 1, geo(auto_ratios), max(auto_ratios) - 1, off


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=Path(__file__).resolve().parents[1] / "RESULTS.md")
    ap.add_argument("--section", default="thirty-fourth session", help="text in the section's heading")
    ap.add_argument("--sms", type=int, default=132, help="processors of the GPU the sweep ran on")
    ap.add_argument("--margin", type=int, default=8, help="modelled gain in percent needed to move")
    ap.add_argument("--grid", action="store_true", help="search the constants over a small grid")
    args = ap.parse_args()
    rows = read_sweeps(args.results, args.section)
    if not rows:
        raise SystemExit("no split-sweep rows found")
    geo, worst, auto_geo, auto_worst, off = score(rows, args.sms, SHIPPED, args.margin)
    if off:
        print(tabulate(off, headers=["layer", "H", "T", "pick", "µs", "auto µs", "fastest µs", "pick vs fastest"]))
    print(f"{len(rows)} shapes; shipped constants {SHIPPED}, margin {args.margin}%: pick vs fastest "
          f"{100 * geo:+.2f}% geometric mean, worst {100 * worst:+.1f}%; auto {100 * auto_geo:+.2f}%, "
          f"worst {100 * auto_worst:+.1f}%")
    if args.grid:
        grid = itertools.product([1, 1.5, 2], [0.5, 1, 2], [1.4, 1.5, 1.6], [0.5, 1, 2], [1.5, 2, 3, 4], [0.5, 1, 2])
        results = sorted((score(rows, args.sms, c, args.margin)[:2], c) for c in grid)
        print(tabulate([[f"{100 * g:+.2f}%", f"{100 * w:+.1f}%", c] for (g, w), c in results[:10]],
                       headers=["geometric mean", "worst", "constants"]))


if __name__ == "__main__":
    main()
