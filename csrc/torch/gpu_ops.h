// The GPU launches the torch binding calls (implemented in gpu_launch.cu).
//
// Plain C++ with no torch and no GPU headers: the binding (ops.cpp, compiled by
// the host compiler) validates arguments, picks the device and stream through
// torch's stable C shim and throws on errors; the nvcc/hipcc-compiled side only
// launches kernels and reports a status code. No exception is ever thrown from
// GPU-compiled code.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mla_ext/merge_attn_states.h"
#include "mla_ext/sparse_mla_decode.h"
#include "mla_ext/status.h"

namespace mla_ext_gpu {

// Multiprocessor (CU) count of device `device`, read once per device; 0 on failure.
int processor_count(int device);

// Whether device `device` runs V3.2 rows' wide 16-head splits in one block per processor
// (mla_ext::decode_wide16_rows; the automatic split count models them apart).
bool decode_wide16_rows(const mla_ext::SparseDecodeParams& p, int device);

// Launch on `stream` (a cudaStream_t / hipStream_t); the device must be current.
// Return an mla_ext::Status as int.
int launch_merge_attn_states(const mla_ext::MergeParams& p, int device, void* stream);
int launch_merge_attn_states_n(const mla_ext::MergeNParams& p, int device, void* stream);
// auto_splits: p.num_splits is the automatic count (the call passed 0): the balanced map may then
// use fewer of its slots, by the rows' lengths (mla_ext::decode_active_splits_table).
int launch_sparse_mla_decode(const mla_ext::SparseDecodeParams& p, void* workspace,
                             size_t workspace_bytes, int device, void* stream, bool auto_splits);

// Test only (torch.ops.mla_ext._test_late_fill): one block that lets the next
// kernel on the stream launch at once (griddepcontrol.launch_dependents, sm_90+)
// and writes `value` to out[0, n) only after spinning delay_ns, so a
// programmatically launched kernel after it that read `out` without waiting
// would see the old values.
int launch_test_late_fill(float* out, int64_t n, float value, int64_t delay_ns, void* stream);

// The runtime's message for the last failed launch on this thread.
const char* last_error_string();

}  // namespace mla_ext_gpu
