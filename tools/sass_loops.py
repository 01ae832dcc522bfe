"""Static instruction mix of the kernels' main loops, from SASS (no GPU needed).

    tools/sass_loops.py A.cubin [B.cubin] [--match SUBSTRING] [--top N]

For each kernel (demangled name containing SUBSTRING) it takes the largest backward branch's span
as the main loop and counts its instructions by opcode (IMAD.MOV apart from IMAD: register moves
that only assemble operands). With two files it prints the kernels whose loops differ, A -> B.
The loop holds every warp's paths (warp-role branches included), so compare like with like.
For one kernel cut at its barriers, with Nsight Compute's stall samples per stretch, see
benchmarks/dev/sass_regions.py.

Needs `cuobjdump` and `nvdisasm` on PATH; on a machine without a CUDA toolkit's binaries they come
from PyPI: `pip download --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, then unzip the
wheels and put nvidia/cu13/bin on PATH. A cubin of every decode instance (sm_90a, ~75 s):
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/include -cubin \\
        -o /tmp/a.cubin csrc/capi/mla_ext_capi.cu
"""
import argparse
import collections
import re
import subprocess

INSN = re.compile(r'\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);')


def demangle(names):
    out = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def loops(path, match):
    sass = subprocess.run(['cuobjdump', '-sass', path], capture_output=True, text=True, check=True).stdout
    parts = re.split(r'\n\s*Function : ', sass)[1:]
    names = demangle([p.split('\n', 1)[0].strip() for p in parts])
    result = {}
    for name, body in zip(names, parts):
        if match not in name:
            continue
        ins = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in map(INSN.match, body.splitlines()) if m]
        span = None
        # (blocks after the last EXIT are out-of-line paths, e.g. BRA.DIV's, jumping back)
        last_exit = max((addr for addr, op, _ in ins if op == 'EXIT'), default=1 << 62)
        for addr, op, rest in ins:
            target = re.search(r'0x([0-9a-f]+)', rest) if op == 'BRA' and addr < last_exit else None
            if target and int(target.group(1), 16) < addr:
                lo = int(target.group(1), 16)
                if span is None or addr - lo > span[1] - span[0]:
                    span = (lo, addr)
        lo, hi = span if span else (0, 1 << 62)
        ops = collections.Counter('IMAD.MOV' if op.startswith('IMAD.MOV') else op.split('.')[0]
                                  for addr, op, _ in ins if lo <= addr <= hi)
        result[name] = ops
    return result


def short(name):
    name = re.sub(r'mla_ext::(decode_detail::)?', '', name).replace('(KvFormat)', 'F')
    return name.replace('false', 'f').replace('true', 't')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('cubin', nargs='+')
    ap.add_argument('--match', default='', help='substring of the demangled kernel name')
    ap.add_argument('--top', type=int, default=14, help='opcodes shown per kernel')
    a = ap.parse_args()
    first = loops(a.cubin[0], a.match)
    if len(a.cubin) == 1:
        for name, ops in first.items():
            total = sum(ops.values())
            print(f'{total:6d}  {short(name)[:120]}')
            print('        ' + ' '.join(f'{k}:{v}' for k, v in ops.most_common(a.top)))
        return
    second = loops(a.cubin[1], a.match)
    for name, ops in first.items():
        other = second.get(name)
        if other is None or other == ops:
            continue
        t0, t1 = sum(ops.values()), sum(other.values())
        moved = sorted(set(ops) | set(other), key=lambda k: -abs(other[k] - ops[k]))[:6]
        print(f'{t0:6d} -> {t1:6d} ({100 * (t1 - t0) / t0:+5.1f}%)  {short(name)[:110]}')
        print('        ' + ' '.join(f'{k}:{ops[k]}->{other[k]}' for k in moved))


if __name__ == '__main__':
    main()
