#include "eredu/cuda/backend.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <utility>

#include "eredu/cuda/cuda_error.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/engine/backend/submission_backend.hpp"
#include "eredu/engine/backend/transfer_backend.hpp"

namespace eredu::cuda {

static_assert(engine::ParameterBackend<Backend>);
static_assert(engine::SubmissionBackend<Backend>);
static_assert(engine::TransferBackend<Backend>);

// The local-file source's instantiations, compiled once here (backend.hpp declares them extern).
template Materialization Backend::materialize(io::CheckpointSource&, const io::TensorReadRequest&,
                                              MaterializationContext&, std::stop_token);
template Materialization Backend::materialize_recipe(io::CheckpointSource&, const engine::DerivedWeightRecipe&,
                                                     MaterializationContext&, std::stop_token);

std::pair<Tensor, Completion> Backend::promote(Executor& executor, const HostBuffer& host, DeviceMemoryPool& memory) {
  Tensor t = Tensor::allocate(memory, host.dtype(), host.shape(), executor.shared_stream());
  Completion c = executor.enqueue([to = t.data(), from = host.bytes().data(), n = host.bytes().size()](cudaStream_t s) {
    check(cudaMemcpyAsync(to, from, n, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (promote)");
  });
  Executor::retain_until_complete(c, host.block());
  Executor::retain_until_complete(c, t.storage());
  return {std::move(t), std::move(c)};
}

std::pair<Tensor, Completion> Backend::promote(Executor& executor, const HostBuffer& host) {
  return promote(executor, host, default_memory(executor.device()));
}

std::pair<HostBuffer, Completion> Backend::demote(Executor& executor, const Tensor& weight) {
  HostBuffer host(weight.dtype(), weight.shape(), weight.nbytes());
  Completion c =
      executor.enqueue([to = host.bytes().data(), from = weight.data(), n = weight.nbytes()](cudaStream_t s) {
        check(cudaMemcpyAsync(to, from, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (demote)");
      });
  Executor::retain_until_complete(c, host.block());
  Executor::retain_until_complete(c, weight.storage());
  return {std::move(host), std::move(c)};
}

DeviceMemoryPool& Backend::default_memory(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<DeviceMemoryPool>> pools;
  std::lock_guard lock(mutex);
  std::unique_ptr<DeviceMemoryPool>& pool = pools[device];
  if (!pool) pool = std::make_unique<DeviceMemoryPool>(device);
  return *pool;
}

}  // namespace eredu::cuda
