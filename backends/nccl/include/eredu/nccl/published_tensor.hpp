#pragma once
/// \file
/// eredu::nccl::published_tensor: a trainer's CUDA device tensor as one tensor of a live-update
/// version (mpi::Publisher::publish). The host cannot address device memory, so the tensor is
/// staged: each subscriber's read is copied out of the device into that one reply (cudaMemcpy,
/// or one cudaMemcpy2D for rows of one length at one stride: a column shard), and hashing
/// copies it out 8 MiB at a time. Nothing of the model is copied to the host ahead
/// of time, and the device memory stays the trainer's: the PublishedTensor holds a handle to
/// it, so it is not freed before the publication is withdrawn.
///
/// \code
///   std::vector<mpi::PublishedTensor> tensors;
///   for (const auto& [name, t] : trainer_weights) tensors.push_back(nccl::published_tensor(name, t));
///   cudaStreamSynchronize(stream.get());  // the step's writes are done before the publisher reads
///   mpi::Publication v = publisher.publish("step-7", "step-6", std::move(tensors));
/// \endcode
///
/// The trainer must not write the tensor until the publication is withdrawn, as with host
/// memory, and must publish only after the work that wrote it has completed: the copies run on
/// CUDA's legacy default stream, which eredu's own streams (non-blocking) are not ordered with.
/// A failed copy is BackendError naming the tensor and the offset, which fails the read, or
/// publish() while it hashes. Staged tensors always go whole, never as a delta.

#include <string>

#include "eredu/cuda/tensor.hpp"
#include "eredu/mpi/publisher.hpp"

namespace eredu::nccl {

/// `tensor` under `name`, staged through the host one read at a time (see file comment).
/// Throws Error(invalid_argument) for an empty tensor handle.
mpi::PublishedTensor published_tensor(std::string name, cuda::Tensor tensor);

}  // namespace eredu::nccl
