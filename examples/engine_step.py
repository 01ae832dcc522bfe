"""The README's "Using it from an engine" calls, runnable: one DeepSeek V4 C4 attention layer of
one decode step, then a chunked-prefill merge, on made-up tensors with the names the README uses;
then the same layer through FlashMLA's call shape (mla_ext.compat.flashmla).

    python examples/engine_step.py                 # CPU
    python examples/engine_step.py --device cuda   # GPU

Builds FP8 (`fp8_ds_mla_v4`) caches with `mla_ext.formats.pack_kv_cache`, runs
`sparse_mla_decode` into a view of a preallocated output buffer and `merge_attn_states` into a
view of a [T, H*128] buffer, checks both against the float64 references in `mla_ext.reference`,
and prints the largest errors. Exit status 1 if a result is off.
"""
import argparse
import sys

import torch

import mla_ext
from mla_ext import formats, reference
from mla_ext.compat import flashmla as flash_mla


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref|, in float64 on the CPU."""
    ref = ref.double().cpu()
    return ((got.double().cpu() - ref).abs().max() / ref.abs().max()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=4, help="T: query rows of this step (1..64)")
    ap.add_argument("--heads", type=int, default=8, help="H: heads on this GPU")
    args = ap.parse_args()
    dev, T, H = args.device, args.tokens, args.heads
    if torch.device(dev).type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {dev}: this torch sees no CUDA/ROCm device")
    g = torch.Generator().manual_seed(0)
    max_num_tokens, num_heads = 64, H
    if not 1 <= T <= max_num_tokens or H < 1:
        ap.error(f"--tokens must be 1..{max_num_tokens} (the engine buffers' size here) and --heads >= 1")
    W, W2 = 128, 512  # sliding window, top-k compressed rows (V4 Flash C4 layer)

    # The engine's caches: a window cache (page 256) and a compressed-row cache (page 64).
    kv_cache = formats.pack_kv_cache(torch.randn(8, 256, 512, generator=g), "fp8_ds_mla_v4").to(dev)
    c4_cache = formats.pack_kv_cache(torch.randn(40, 64, 512, generator=g), "fp8_ds_mla_v4").to(dev)
    q = torch.randn(T, H, 512, generator=g).to(torch.bfloat16).to(dev)
    indices = torch.randint(0, 8 * 256, (T, W), generator=g, dtype=torch.int32).to(dev)
    topk_indices = torch.randint(0, 40 * 64, (T, W2), generator=g, dtype=torch.int32).to(dev)
    window_lens = torch.randint(1, W + 1, (T,), generator=g, dtype=torch.int32).to(dev)
    topk_lens = torch.randint(0, W2 + 1, (T,), generator=g, dtype=torch.int32).to(dev)
    sinks = torch.randn(H, generator=g).to(dev)
    attn_out = torch.empty(max_num_tokens, H, 512, dtype=torch.bfloat16, device=dev)

    # Once, at start-up: one workspace for every layer and step.
    ws = mla_ext.DecodeWorkspace(max_num_tokens, num_heads, device=dev)

    # Per layer, per decode step: straight into the layer's output view.
    layer = dict(kv_format="fp8_ds_mla_v4", softmax_scale=reference.softmax_scale_v4(), lengths=window_lens,
                 extra_kv_cache=c4_cache, extra_indices=topk_indices, extra_lengths=topk_lens, attn_sink=sinks)
    mla_ext.sparse_mla_decode(q, kv_cache, indices, output=attn_out[:T], workspace=ws.tensor, lse=None, **layer)

    ref_o, _ = reference.sparse_mla_decode(q, kv_cache, indices, **layer)
    tol, _ = reference.decode_tolerances(torch.device(dev).type, "fp8_ds_mla_v4")
    err_d = rel_err(attn_out[:T], ref_o)

    # Chunked prefill: merge two partial results into a view of the layer's [T, H*128] output;
    # the partials are [T, H, 192] (values padded to the QK head size), vLLM's LSEs [H, T].
    out_buf = torch.empty(T, H * 128, dtype=torch.bfloat16, device=dev)
    out_view = out_buf.view(T, H, 128)
    prefix_out = torch.randn(T, H, 192, generator=g).to(torch.bfloat16).to(dev)
    suffix_out = torch.randn(T, H, 192, generator=g).to(torch.bfloat16).to(dev)
    prefix_lse = (3 * torch.randn(H, T, generator=g)).to(dev)
    suffix_lse = (3 * torch.randn(H, T, generator=g)).to(dev)
    mla_ext.merge_attn_states(out_view, None, prefix_out[..., :128], prefix_lse.T, suffix_out[..., :128],
                              suffix_lse.T)

    ref_m, _ = reference.merge_attn_states(prefix_out[..., :128], prefix_lse.T, suffix_out[..., :128],
                                           suffix_lse.T)
    err_m = rel_err(out_view, ref_m)
    merge_tol = 8e-3  # two bf16 roundings (inputs, output) of values up to max |ref|

    print(f"sparse_mla_decode ({T} tokens x {H} heads, window {W} + top-{W2}, {dev}): "
          f"max error {err_d:.2e} of max |ref| (tolerance {tol:g})")
    print(f"merge_attn_states into a [T, H*128] buffer's view: max error {err_m:.2e} of max |ref| (tolerance {merge_tol:g})")

    # The same layer as an engine on FlashMLA calls it (README, "Coming from FlashMLA's sparse
    # decode"): one request per query row (seq_len_q = 1), FlashMLA's 4-D cache views, the
    # per-request lengths; the same op underneath, so the same bits.
    sched, _ = flash_mla.get_mla_metadata(workspace=ws.tensor)
    flash_out = torch.empty_like(attn_out)
    flash_mla.flash_mla_with_kvcache(
        q.unsqueeze(1), kv_cache.unsqueeze(2), None, None, 512, sched, softmax_scale=reference.softmax_scale_v4(),
        is_fp8_kvcache=True, indices=indices.unsqueeze(1), attn_sink=sinks, extra_k_cache=c4_cache.unsqueeze(2),
        extra_indices_in_kvcache=topk_indices.unsqueeze(1), topk_length=window_lens, extra_topk_length=topk_lens,
        out=flash_out[:T].view(-1, 1, H, 512), return_softmax_lse=False)
    same = torch.equal(flash_out[:T], attn_out[:T])
    print(f"the same layer through mla_ext.compat.flashmla: {'bit-identical' if same else 'DIFFERENT'}")
    ok = err_d <= tol and err_m <= merge_tol and same
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
