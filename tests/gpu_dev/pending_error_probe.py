"""Developer probe: does a call leave a runtime error the caller left pending untouched?

Each case runs in a fresh process (first-use work happens once per process): sets error 101
(cudaSetDevice of an invalid ordinal, through the shared CUDA runtime torch loaded), makes one
call, and prints the error pending afterwards (101 = kept, 0 = cleared). Cases: the torch merge
and decode ops (first call, or after a warm-up call), torch's own stream query, and the C API
decode library (`--so`, which must link the shared runtime: tests/gpu_dev/build_capi.sh does).
The twenty-seventh session saw the torch decode's first call clear it; the twenty-eighth found
the C API's first call did too, and the cause in the runtime itself (runtime_pending_error.cu:
cudaFuncSetAttribute clears a pending error even when it succeeds), after which every case here
keeps it (benchmarks/NOTES.md).

Usage: python3 tests/gpu_dev/pending_error_probe.py [--so build/gpu_dev/libmla_ext_capi.so]
"""
import argparse
import os
import subprocess
import sys

CASES = ["merge", "merge_warm", "decode", "decode_warm", "decode_s4", "stream", "capi", "capi_warm"]


def one(case: str, so: str) -> None:
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if case.startswith("merge"):
        import mla_ext

        a = torch.randn(2, 4, 64, device="cuda")
        lse = torch.randn(2, 4, device="cuda")
        o = torch.empty_like(a)
        call = lambda: mla_ext.merge_attn_states(o, None, a, lse, a, lse)
    elif case.startswith("decode"):
        import mla_ext

        sys.path.insert(0, os.path.join(root, "tests"))
        from test_sparse_mla_decode import make_cache, make_indices, poisoned_buffers

        S = 4 if case.endswith("s4") else 1
        g = torch.Generator().manual_seed(3)
        idx, lengths = make_indices(g, 3, 300, 20 * 64, "scattered", "random")
        cache = make_cache(g, "fp8_ds_mla_v4", 512, 20, 64, idx, "cuda")
        q = torch.randn(3, 16, 512, generator=g).to(torch.bfloat16).cuda()
        out, lse, ws = poisoned_buffers(3, 16, S, "cuda")
        idx, lengths = idx.cuda(), lengths.cuda()
        call = lambda: mla_ext.sparse_mla_decode(q, cache, idx, output=out, workspace=ws, lse=lse,
                                                 kv_format="fp8_ds_mla_v4", softmax_scale=0.07, lengths=lengths,
                                                 num_splits=S)
    elif case == "stream":
        call = torch.cuda.current_stream
    else:
        sys.path.insert(0, os.path.join(root, "tests", "gpu_dev"))
        import decode_ctypes_check as D

        if not D.links_shared_cuda_runtime(so):
            print(f"{case:12s}: {so} does not link the shared CUDA runtime (rebuild with build_capi.sh)")
            return
        lib = D.load_lib(so)
        gen = torch.Generator().manual_seed(5)
        runner = D.Runner(lib, torch.cuda.get_device_properties(0).multi_processor_count)
        cache = D.Cache("fp8_ds_mla_v4", 512, num_pages=16, page_size=64, gen=gen, dev=torch.device("cuda"),
                        poison_frac=0.0)
        idx = torch.randperm(cache.num_slots, generator=gen)[:600].view(3, 200).to(torch.int32).cuda()
        q = torch.randn(3, 16, 512, generator=gen).to(torch.bfloat16).cuda()
        out = torch.empty(3, 16, 512, dtype=torch.bfloat16, device="cuda")
        p, ws, wsb, _ = runner.prepare("fp8_ds_mla_v4", 512, q, [(cache, idx, None)], 0.06, None, 1, False, out, None)
        call = lambda: runner.launch(p, ws, wsb)
    sys.path.insert(0, os.path.join(root, "tests"))
    from conftest import loaded_cuda_runtime

    rt = loaded_cuda_runtime()
    if case.endswith("_warm"):
        call()
        torch.cuda.synchronize()
    err = rt.cudaSetDevice(1 << 20)
    call()
    still = rt.cudaPeekAtLastError()
    rt.cudaGetLastError()
    torch.cuda.synchronize()
    print(f"{case:12s}: pending {err} -> {still} ({'kept' if still == err else 'CLEARED' if still == 0 else 'changed'})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--so", default="build/gpu_dev/libmla_ext_capi.so")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in this process
    args = ap.parse_args()
    if args.case:
        one(args.case, args.so)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("pending_error_probe.py: needs a CUDA GPU", file=sys.stderr)
        return 1
    for case in CASES:
        if case.startswith("capi") and not os.path.exists(args.so):
            print(f"{case:12s}: no {args.so} (tests/gpu_dev/build_capi.sh builds it)")
            continue
        r = subprocess.run([sys.executable, __file__, "--case", case, "--so", args.so], capture_output=True, text=True)
        print((r.stdout.strip().splitlines() or [f"{case:12s}: failed: " + r.stderr.strip()[-300:]])[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
