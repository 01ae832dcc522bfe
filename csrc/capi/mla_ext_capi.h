// mla_ext C entry points: a stable, torch-free C ABI over the header-only
// launchers (used by C/C++ engines through a shared library, and by the
// ctypes developer harness in tests/gpu_dev).
#pragma once

#include <stddef.h>

#ifdef __cplusplus
#include "mla_ext/sparse_mla_decode.h"
#define MLA_EXT_CAPI_PARAMS const mla_ext::SparseDecodeParams
extern "C" {
#else
#define MLA_EXT_CAPI_PARAMS const void
#endif

#if defined(_WIN32)
#define MLA_EXT_CAPI_EXPORT __declspec(dllexport)
#else
#define MLA_EXT_CAPI_EXPORT __attribute__((visibility("default")))
#endif

// Sparse MLA decode (DESIGN.md §4). `p` points to a mla_ext::SparseDecodeParams
// with num_splits resolved (1..64); `workspace` needs
// decode_workspace_size(T, H, num_splits) bytes when num_splits > 1; `stream` is
// a cudaStream_t / hipStream_t (NULL = legacy default stream). Returns a
// mla_ext::Status value (0 = success). Asynchronous: no host sync.
MLA_EXT_CAPI_EXPORT int mla_ext_sparse_mla_decode(MLA_EXT_CAPI_PARAMS* p, void* workspace,
                                                  size_t workspace_bytes, int num_sms, void* stream);

// Workspace bytes for (num_tokens, num_heads, num_splits), 0 when num_splits <= 1.
MLA_EXT_CAPI_EXPORT size_t mla_ext_sparse_mla_decode_workspace_size(long long num_tokens,
                                                                    long long num_heads, int num_splits);

// The automatic split count (shapes and processor count only).
MLA_EXT_CAPI_EXPORT int mla_ext_sparse_mla_decode_num_splits(long long num_tokens, long long num_heads,
                                                             long long total_width, int num_sms);

// sizeof(mla_ext::SparseDecodeParams), so bindings can check their mirror.
MLA_EXT_CAPI_EXPORT size_t mla_ext_sparse_decode_params_size(void);

// Human-readable text for a status value.
MLA_EXT_CAPI_EXPORT const char* mla_ext_status_string(int status);

#ifdef __cplusplus
}
#endif
