// Status codes of every launcher (no exceptions cross the kernel layer).
// Plain C++: included by GPU code (via compat.h) and by host-only code alike.
#pragma once

namespace mla_ext {

enum class Status : int {
  kSuccess = 0,
  kInvalidArgument = 1,   // a params field is out of its documented range
  kWorkspaceTooSmall = 2, // workspace_bytes < the size the call needs
  kLaunchFailed = 3,      // the runtime rejected the launch; its error is left pending (last error)
  kUnsupported = 4,       // no kernel fits: each one needs more shared memory per block than allowed
};

inline const char* status_string(Status s) {
  switch (s) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kWorkspaceTooSmall: return "workspace too small";
    case Status::kLaunchFailed: return "kernel launch failed";
    case Status::kUnsupported: return "no kernel fits the shared-memory limit (smem_limit or the device's)";
  }
  return "unknown status";
}

}  // namespace mla_ext
