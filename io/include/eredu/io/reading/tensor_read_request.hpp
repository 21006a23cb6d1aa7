#pragma once
/// \file
/// eredu::io::TensorReadRequest: which bytes of which tensor, under which memory policy.

#include <string>

#include "eredu/core/selection.hpp"

namespace eredu::io {

/// How a request may use the lease pool.
enum class ReadPolicy {
  require_bounded,  ///< one lease holding every selected byte; larger than the pool = error
  chunked,          ///< a sequence of bounded chunk leases (CheckpointSource::stream)
};

/// A request for (part of) one tensor's bytes.
struct TensorReadRequest {
  std::string key{};                                ///< checkpoint tensor name
  Selection selection = Selection::all();           ///< which elements; whole tensor by default
  ReadPolicy policy = ReadPolicy::require_bounded;  ///< memory policy
};

}  // namespace eredu::io
