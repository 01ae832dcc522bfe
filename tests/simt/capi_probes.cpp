// The C API for the SIMT emulator (tests/simt_capi.py builds this file, not mla_ext_capi.cu
// alone), plus test probes that compute on the host, one token at a time with plain sums, what
// the kernels compute with block-wide scans: a wrong scan can keep the results right (every
// token still gets a valid run of split slots) and only lose balance, so the tests compare the
// kernels' token map with this one.
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
  int64_t total = 0;
  for (int64_t t = 0; t < T; ++t) total += mla_ext::decode_token_cost(p, t);
  const mla_ext::ActiveSplits act = auto_splits
      ? mla_ext::decode_active_splits_table(T, H, mla_ext::decode_total_width(p), num_sms, S)
      : mla_ext::ActiveSplits();
  int64_t prefix = 0, first = 0;  // C_t; the token's first cell
  for (int64_t t = 0; t < T; ++t) {
    const int64_t cost = mla_ext::decode_token_cost(p, t);
    int64_t n, next;
    if (act.on()) {  // cells in token order, n_t each
      const int sa = mla_ext::decode_active_count(act, total, T, mla_ext::decode_total_width(p));
      n = mla_ext::decode_active_slots(cost, total, T, sa);
      next = first + n;
    } else {  // F(t) .. F(t + 1)
      prefix += cost;
      next = mla_ext::decode_balanced_first_slot(t + 1, prefix, total, T, S);
      n = mla_ext::decode_balanced_slots(first, next);
    }
    // The anchored map (decode_active_slack): a token of one slot has no workspace cell, and
    // its first split block writes {0, 1}.
    const bool anchored_single = act.on() && mla_ext::decode_active_slack(T) && n == 1;
    map[2 * t] = uint32_t(anchored_single ? 0 : first);
    map[2 * t + 1] = uint32_t(n);
    first = next;
  }
  return 0;
}

}  // extern "C"
