// keel/csrc/stable/device.h
// Which device an op wrapper serves, and the launch context for it: the CPU
// library runs kernels inline; the CUDA library sets a device guard and passes the
// current stream. Wrappers are written once and compiled into both libraries.
#pragma once

#include "stable/check.h"
#include "stable/tensor.h"

#ifdef KEEL_CUDA_LIBRARY
#include "stable/cuda.h"
#endif

namespace keel {

// `t` must live on the device kind this library implements (CPU in _C, CUDA in _C_cuda).
// An undefined tensor (None passed for a Tensor argument) is refused here, at no extra cost: the
// shim's device query fails for it.
inline void check_library_device(const char* op, const char* arg, const Tensor& t) {
  int32_t type = 0;
  KEEL_CHECK(aoti_torch_get_device_type(t.get(), &type) == AOTI_TORCH_SUCCESS, op, ": ", arg,
             " must be a tensor, got an undefined tensor (None)");
#ifdef KEEL_CUDA_LIBRARY
  KEEL_CHECK(type == shim_codes().cuda, op, ": ", arg, " must be a CUDA tensor, got ", device_name(t));
#else
  KEEL_CHECK(type == shim_codes().cpu, op, ": ", arg, " must be a CPU tensor, got ", device_name(t));
#endif
}

// Launch context: on CUDA holds the device guard for `t`'s device and its current stream.
class LaunchContext {
 public:
  explicit LaunchContext(const Tensor& t)
#ifdef KEEL_CUDA_LIBRARY
      : guard_(t.get_device_index()),
        stream_(current_cuda_stream(t))
#endif
  {
    (void)t;
  }
  void* stream() const { return stream_; }

 private:
#ifdef KEEL_CUDA_LIBRARY
  DeviceGuard guard_;
#endif
  void* stream_ = nullptr;
};

}  // namespace keel
