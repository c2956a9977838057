// keel/csrc/stable/library.h
// Op registration. One source file per op registers its implementation for the
// device of the library it is compiled into: CPU in _C, CUDA in _C_cuda (-DKEEL_CUDA_LIBRARY).
#pragma once

#include <torch/csrc/stable/library.h>

#include "stable/tensor.h"

#ifdef KEEL_CUDA_LIBRARY
#define KEEL_IMPL_DEVICE CUDA
#else
#define KEEL_IMPL_DEVICE CPU
#endif

#define KEEL_LIBRARY_IMPL_(ns, dev, m) STABLE_TORCH_LIBRARY_IMPL(ns, dev, m)
// KEEL_LIBRARY_IMPL(m) { m.impl("op", TORCH_BOX(&keel::op)); }
#define KEEL_LIBRARY_IMPL(m) KEEL_LIBRARY_IMPL_(keel, KEEL_IMPL_DEVICE, m)
#define KEEL_LIBRARY(m) STABLE_TORCH_LIBRARY(keel, m)
