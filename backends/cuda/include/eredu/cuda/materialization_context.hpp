#pragma once
/// \file
/// eredu::cuda::MaterializationContext: what the CUDA backend uses while realizing weights.

#include "eredu/cuda/device_memory_pool.hpp"
#include "eredu/cuda/executor.hpp"
#include "eredu/cuda/pinned_registration.hpp"

namespace eredu::cuda {

/// The stream copies and kernels run on, the pool device memory comes from, and (optionally)
/// the page-locked registration of the source's staging memory. All must outlive every
/// materialization started with the context.
struct MaterializationContext {
  Executor& executor;        ///< the stream: H2D copies, conversion and layout kernels
  DeviceMemoryPool& memory;  ///< device memory of weights and temporaries
  const PinnedRegistration* staging =
      nullptr;  ///< pin_staging(source); when null or not covering a
                ///< lease, that copy reads pageable memory (slower; a warning is logged once)
};

}  // namespace eredu::cuda
