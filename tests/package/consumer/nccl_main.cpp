// The nccl component of the installed package in a consumer: with a CUDA device per rank, an
// NCCL communicator made over MPI's world and one all_reduce over it, checked against the sum
// of every rank's value; without, it only links and says so (CI has no GPU).
#include <cuda_runtime_api.h>

#include <asio/use_future.hpp>
#include <cstdio>
#include <vector>

#include "eredu/cuda/device.hpp"
#include "eredu/cuda/executor.hpp"
#include "eredu/engine/backend/collective_backend.hpp"
#include "eredu/mpi/communicator.hpp"
#include "eredu/mpi/environment.hpp"
#include "eredu/nccl/backend.hpp"
#include "eredu/nccl/communicator.hpp"

int main(int argc, char** argv) {
  using namespace eredu;
  mpi::Environment env(argc, argv);
  int failures = 0;
  {
    mpi::Communicator world = mpi::Communicator::world(env, {.timeout = std::chrono::seconds(30)});
    // Every rank of one host decides alike: the same device count, the same world size.
    const int devices = cuda::device_count();
    if (devices < world.size()) {
      std::printf("consumer_nccl: rank %d: %d CUDA device(s) for %d ranks: linked, nothing run\n", world.rank(),
                  devices, world.size());
      return 0;
    }
    const int device = world.rank();
    cuda::DeviceGuard guard(device);
    nccl::Communicator gpus = nccl::Communicator::create(world, device);
    cuda::Executor stream(device);
    std::vector<float> host(4, static_cast<float>(world.rank() + 1));
    cuda::Tensor t =
        cuda::Tensor::allocate(cuda::Backend::default_memory(device), DType::F32, {4}, stream.shared_stream());
    if (cudaMemcpy(t.data(), host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice) != cudaSuccess) return 1;
    auto reduced = engine::async_all_reduce<nccl::Backend>(stream, gpus, t, engine::ReduceOp::sum, asio::use_future);
    const cuda::Tensor sum = reduced.get();
    if (cudaMemcpy(host.data(), sum.data(), sizeof(float) * host.size(), cudaMemcpyDeviceToHost) != cudaSuccess)
      return 1;
    const int n = world.size();
    for (float v : host)
      if (v != static_cast<float>(n * (n + 1) / 2)) ++failures;
    std::printf("consumer_nccl: rank %d of %d: all_reduce %s\n", world.rank(), n, failures == 0 ? "ok" : "wrong");
  }
  return failures == 0 ? 0 : 1;
}
