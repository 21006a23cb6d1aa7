#pragma once
/// \file
/// The VerifyingBackend concept: a ParameterBackend that can hash a weight it materialized
/// with the checkpoint's dtype kept, where that weight lives, on its own executor. The
/// engine then checks a load's digests against the bytes the load delivered rather than
/// against a second read of the file (verify_options.hpp). Optional: the orchestration uses
/// it where a backend has it, and re-reads the file where it does not.

#include <concepts>

#include "eredu/core/completion.hpp"
#include "eredu/engine/backend/parameter_backend.hpp"
#include "eredu/io/integrity/checksums.hpp"

namespace eredu::engine {

/// A backend whose dtype-kept weights hold the stored bytes and can be hashed in place.
/// `B::verify_weight(context, weight, check)` starts hashing `weight` (a whole tensor read with
/// its dtype kept, materialized and complete) and returns a Completion that fails with
/// Error(checksum_mismatch) — io::DigestCheck::verify's — when the bytes differ.
template <class B>
concept VerifyingBackend = ParameterBackend<B> &&
    requires(typename B::MaterializationContext& context, const typename B::MaterializedWeight& weight,
             io::DigestCheck check) {
  { B::verify_weight(context, weight, std::move(check)) } -> std::same_as<Completion>;
};

}  // namespace eredu::engine
