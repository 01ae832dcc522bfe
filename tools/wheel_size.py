#!/usr/bin/env python3
"""Size of a built mla_ext library per kernel family (builds nothing).

    python tools/wheel_size.py [LIB.so ...]     (default: mla_ext/_C*.so)

Host code: `nm --size-sort -S -C` symbol sizes. Device code: the GPU code
objects embedded in the library (.nv_fatbin for CUDA, .hip_fatbin for HIP) are
found and their per-kernel sections (CUDA cubins: .text.<kernel> and the
kernel's .nv.info/.nv.constant sections; AMD code objects: symbol sizes) are
attributed to the same families. Compressed code objects and PTX are counted
as a whole ("ptx", "compressed"). Families, by symbol name (first match wins):

    cpu                    CPU twins (mla_ext::cpu::)
    binding                torch binding (mla_ext_torch::, torch::stable, the C API)
    merge_attn_states      GPU merge kernel (+ its launch stubs)
    decode_split_mma       sparse decode, tensor-core split kernels
    decode_split_portable  sparse decode, portable split kernels
    decode_reduce          sparse decode, split reduction
    other                  everything else (runtime, libstdc++ instantiations)
"""
import argparse
import glob
import os
import re
import struct
import subprocess
import sys

FAMILIES = [
    ("cpu", re.compile(r"mla_ext::cpu::")),
    ("decode_split_mma", re.compile(r"decode_split_mma")),
    ("decode_split_portable", re.compile(r"decode_split_portable")),
    ("decode_reduce", re.compile(r"decode_reduce")),
    ("merge_attn_states", re.compile(r"merge_attn_states_kernel|launch_merge|merge_attn_states")),
    ("binding", re.compile(r"mla_ext_torch::|torch::stable|STABLE_TORCH|PyInit|mla_ext_(capi|sparse|merge|status)")),
]
ORDER = [f for f, _ in FAMILIES] + ["ptx", "compressed", "other"]


def family(name):
    # The torch binding's wrappers around the CPU twins belong to the binding.
    if name.startswith("mla_ext_torch::") or "torch::stable::" in name:
        return "binding"
    for fam, rx in FAMILIES:
        if rx.search(name):
            return fam
    return "other"


def demangle(names):
    if not names:
        return {}
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                             check=True).stdout.splitlines()
        return dict(zip(names, out))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


# ---------------------------------------------------------------- ELF (64-bit little-endian only)
def elf_sections(data, base=0):
    """[(name, type, offset, size)] of the ELF image at data[base:], or None."""
    if data[base:base + 4] != b"\x7fELF" or data[base + 4] != 2 or data[base + 5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, base + 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, base + 0x3A)
    if shoff == 0 or shentsize < 64 or base + shoff + shnum * shentsize > len(data):
        return None
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, base + shoff + i * shentsize) for i in range(shnum)]
    str_off = raw[shstrndx][4] if shstrndx < shnum else 0

    def name(off):
        start = base + str_off + off
        return data[start:data.index(b"\0", start)].decode("latin-1")

    return [(name(s[0]), s[1], s[4], s[5]) for s in raw]


def elf_machine(data, base=0):
    return struct.unpack_from("<H", data, base + 18)[0]


def elf_end(data, base, sections):
    shoff, = struct.unpack_from("<Q", data, base + 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, base + 0x3A)
    end = shoff + shentsize * shnum
    for _, typ, off, size in sections:
        if typ != 8:  # SHT_NOBITS
            end = max(end, off + size)
    return end


SECTION_PREFIXES = (".text.", ".nv.info.", ".nv.constant0.", ".nv.constant2.", ".rela.text.", ".rel.text.",
                    ".nv.callgraph.", ".nv.local.", ".nv.shared.")


def device_sizes(data, start, end):
    """Per-symbol sizes of the GPU code objects in data[start:end]: ({mangled: bytes}, extra)."""
    per_symbol, extra = {}, {"ptx": 0, "compressed": 0}
    blob = data[start:end]
    # CUDA fatbin containers: header (magic 0xBA55ED50, version, header size, body size), then
    # entries (kind 1 PTX / 2 ELF, header size, padded payload size, ..., flags bit 0x2000 compressed).
    pos, found_container = 0, False
    while pos + 16 <= len(blob):
        magic, _ver, hsize, body = struct.unpack_from("<IHHQ", blob, pos)
        if magic != 0xBA55ED50:
            break
        found_container = True
        p, stop = pos + hsize, pos + hsize + body
        while p + 64 <= stop:
            kind, _v, ehdr, padded = struct.unpack_from("<HHII", blob, p)
            flags, = struct.unpack_from("<Q", blob, p + 40)
            payload = p + ehdr
            if ehdr == 0:
                break
            if flags & 0x2000:
                extra["compressed"] += padded
            elif kind == 1:
                extra["ptx"] += padded
            else:
                _add_elf(blob, payload, per_symbol, extra)
            p = payload + padded
        pos = stop
    if not found_container:  # HIP offload bundles (or anything else): scan for ELF images
        p = blob.find(b"\x7fELF")
        while p >= 0:
            n = _add_elf(blob, p, per_symbol, extra)
            p = blob.find(b"\x7fELF", p + max(n, 4))
    return per_symbol, extra


def _add_elf(blob, base, per_symbol, extra):
    secs = elf_sections(blob, base)
    if secs is None:
        return 0
    if any(name.startswith(".text.") for name, *_ in secs):  # CUDA cubin: sections per kernel
        for name, typ, _off, size in secs:
            if typ == 8:
                continue
            for pre in SECTION_PREFIXES:
                if name.startswith(pre):
                    sym = name[len(pre):]
                    per_symbol[sym] = per_symbol.get(sym, 0) + size
                    break
    else:  # AMDGPU code object: FUNC symbols with sizes in .symtab
        symtab = [s for s in secs if s[1] == 2]
        strtab = {i: s for i, s in enumerate(secs)}
        for _name, _typ, off, size in symtab:
            link_idx = _section_link(blob, base, secs.index((_name, _typ, off, size)))
            str_off = strtab[link_idx][2]
            for i in range(size // 24):
                st_name, st_info, _o, _sh, _val, st_size = struct.unpack_from("<IBBHQQ", blob, base + off + i * 24)
                if st_info & 0xF == 2 and st_size:  # STT_FUNC
                    s = base + str_off + st_name
                    sym = blob[s:blob.index(b"\0", s)].decode("latin-1")
                    per_symbol[sym] = per_symbol.get(sym, 0) + st_size
    return elf_end(blob, base, secs)


def _section_link(blob, base, index):
    shoff, = struct.unpack_from("<Q", blob, base + 0x28)
    shentsize, = struct.unpack_from("<H", blob, base + 0x3A)
    return struct.unpack_from("<I", blob, base + shoff + index * shentsize + 40)[0]


# ---------------------------------------------------------------- report
def host_sizes(path):
    out = subprocess.run(["nm", "--size-sort", "-S", "-C", path], capture_output=True, text=True,
                         check=True).stdout
    sizes, counts = {}, {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or parts[2] not in "tTwWiu":  # code only (no data/bss)
            continue
        fam = family(parts[3])
        sizes[fam] = sizes.get(fam, 0) + int(parts[1], 16)
        counts[fam] = counts.get(fam, 0) + 1
    return sizes, counts


def report(path):
    data = open(path, "rb").read()
    secs = elf_sections(data) or []
    sec_size = {name: size for name, _t, _o, size in secs}
    host, host_n = host_sizes(path)
    dev, dev_n = {}, {}
    for fat in (".nv_fatbin", ".hip_fatbin"):
        for name, _t, off, size in secs:
            if name == fat:
                per_symbol, extra = device_sizes(data, off, off + size)
                names = demangle(sorted(per_symbol))
                for sym, n in per_symbol.items():
                    fam = family(names.get(sym, sym))
                    dev[fam] = dev.get(fam, 0) + n
                    dev_n[fam] = dev_n.get(fam, 0) + 1
                for k, n in extra.items():
                    if n:
                        dev[k] = dev.get(k, 0) + n
    rows = [f for f in ORDER if host.get(f) or dev.get(f)]
    debug = sum(size for name, size in sec_size.items() if name.startswith(".debug"))
    print(f"{path}: {os.path.getsize(path) / 1024:.1f} KiB on disk "
          f"(.text {sec_size.get('.text', 0) / 1024:.1f} KiB, "
          f"GPU code objects {(sec_size.get('.nv_fatbin', 0) + sec_size.get('.hip_fatbin', 0)) / 1024:.1f} KiB, "
          f"debug info {debug / 1024:.1f} KiB)")
    w = max(len(r) for r in rows + ["family"])
    print(f"  {'family':<{w}}  {'host KiB':>9}  {'host syms':>9}  {'device KiB':>10}  {'device syms':>11}")
    for r in rows:
        print(f"  {r:<{w}}  {host.get(r, 0) / 1024:>9.1f}  {host_n.get(r, 0):>9}  "
              f"{dev.get(r, 0) / 1024:>10.1f}  {dev_n.get(r, 0):>11}")
    print(f"  {'total':<{w}}  {sum(host.values()) / 1024:>9.1f}  {sum(host_n.values()):>9}  "
          f"{sum(dev.values()) / 1024:>10.1f}  {sum(dev_n.values()):>11}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("libs", nargs="*", help="shared libraries (default: mla_ext/_C*.so)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    libs = args.libs or sorted(glob.glob(os.path.join(root, "mla_ext", "_C*.so")))
    if not libs:
        print("wheel_size: no mla_ext/_C*.so (run `make setup` first)", file=sys.stderr)
        return 1
    for lib in libs:
        report(lib)
    return 0


if __name__ == "__main__":
    sys.exit(main())
