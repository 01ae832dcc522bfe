// The C API for the SIMT emulator (tests/simt_capi.py builds this file, not mla_ext_capi.cu
// alone), plus test probes. mla_ext_simt_token_map gives the split map computed on the host one
// token at a time with plain sums (mla_ext::decode_split_map, which the CPU twin uses), where
// the kernels compute it with block-wide scans: a wrong scan can keep the results right (every
// token still gets a valid run of split slots) and only lose balance, so the tests compare the
// kernels' token map with this one.
#include <vector>

#include "mla_ext_capi.cu"

extern "C" {

// The balanced split map the decode of `c` (num_sms processors) writes into its workspace
// (sparse_mla_decode.h's workspace layout, DecodeArgs::ws_map): {first cell, cell count} per
// token into map[2 * num_tokens], and the map's byte offset in the workspace into *offset.
// Returns 0, 1 where the call runs no token map (one split, or not the balanced map), or a
// negative value for arguments the decode refuses (launch_sparse_mla_decode decides those).
int mla_ext_simt_token_map(const mla_ext_sparse_decode_params* c, int num_sms, uint32_t* map, long long* offset) {
  if (c == nullptr || c->num_splits < 0 || num_sms <= 0) return -1;
  mla_ext::SparseDecodeParams p = to_cpp(*c);
  const bool auto_splits = p.num_splits == 0;
  if (auto_splits) p.num_splits = mla_ext::decode_auto_splits(p, num_sms);
  const int64_t T = p.num_tokens, H = p.num_heads;
  const int S = p.num_splits;
  if (S <= 1 || !mla_ext::decode_balanced(p)) return 1;
  *offset = static_cast<long long>(mla_ext::decode_partial_out_bytes(T, H, S) +
                                   mla_ext::decode_partial_lse_bytes(T, H, S));
  const mla_ext::ActiveSplits act = auto_splits
      ? mla_ext::decode_active_splits_table(T, H, mla_ext::decode_total_width(p), num_sms, S)
      : mla_ext::ActiveSplits();
  std::vector<int64_t> first(static_cast<size_t>(T));
  std::vector<int> count(static_cast<size_t>(T));
  mla_ext::decode_split_map(p, act, first.data(), count.data());
  for (int64_t t = 0; t < T; ++t) {
    // The anchored map (decode_active_slack): a token of one slot has no workspace cell, and
    // its first split block writes {0, 1}.
    const bool anchored_single = act.on() && mla_ext::decode_active_slack(T) && count[t] == 1;
    map[2 * t] = uint32_t(anchored_single ? 0 : first[t]);
    map[2 * t + 1] = uint32_t(count[t]);
  }
  return 0;
}

}  // extern "C"
