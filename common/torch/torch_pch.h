// Precompiled header for LibTorch targets (target_precompile_headers). Only
// third-party headers that are expensive and stable belong here.
#ifndef SPECSTREAM_COMMON_TORCH_TORCH_PCH_H_
#define SPECSTREAM_COMMON_TORCH_TORCH_PCH_H_

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#endif  // SPECSTREAM_COMMON_TORCH_TORCH_PCH_H_
