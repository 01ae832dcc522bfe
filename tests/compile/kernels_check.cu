// Compile check of every torch-free GPU kernel header (nvcc for sm_90a, hipcc for AMD).
// Instantiates each launcher; never run. Used by tools/compile_check.sh (CI).
#include "mla_ext/merge_attn_states.cuh"
#if __has_include("mla_ext/sparse_mla_decode.cuh")
#include "mla_ext/sparse_mla_decode.cuh"
#define MLA_EXT_CHECK_DECODE 1
#endif

int mla_ext_compile_check(void* stream) {
  mla_ext::MergeParams mp;
  int rc = int(mla_ext::launch_merge_attn_states(mp, 132, static_cast<mla_ext::gpuStream_t>(stream)));
  mla_ext::MergeNParams mnp;
  rc += int(mla_ext::launch_merge_attn_states_n(mnp, 132, static_cast<mla_ext::gpuStream_t>(stream)));
#if defined(MLA_EXT_CHECK_DECODE)
  mla_ext::SparseDecodeParams dp;
  rc += int(mla_ext::launch_sparse_mla_decode(dp, nullptr, 0, 132, static_cast<mla_ext::gpuStream_t>(stream)));
#endif
  return rc;
}
