// mla_ext C entry points (see mla_ext_capi.h).
#include "mla_ext_capi.h"

#include "mla_ext/sparse_mla_decode.cuh"

extern "C" {

int mla_ext_sparse_mla_decode(const mla_ext::SparseDecodeParams* p, void* workspace, size_t workspace_bytes,
                              int num_sms, void* stream) {
  if (p == nullptr) return int(mla_ext::Status::kInvalidArgument);
  return int(mla_ext::launch_sparse_mla_decode(*p, workspace, workspace_bytes, num_sms,
                                               static_cast<mla_ext::gpuStream_t>(stream)));
}

size_t mla_ext_sparse_mla_decode_workspace_size(long long num_tokens, long long num_heads, int num_splits) {
  return mla_ext::decode_workspace_size(num_tokens, num_heads, num_splits);
}

int mla_ext_sparse_mla_decode_num_splits(long long num_tokens, long long num_heads, long long total_width,
                                         int num_sms) {
  return mla_ext::decode_num_splits(num_tokens, num_heads, total_width, num_sms);
}

size_t mla_ext_sparse_decode_params_size(void) { return sizeof(mla_ext::SparseDecodeParams); }

const char* mla_ext_status_string(int status) {
  return mla_ext::status_string(static_cast<mla_ext::Status>(status));
}

}  // extern "C"
