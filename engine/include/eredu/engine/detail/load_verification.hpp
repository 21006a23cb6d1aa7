#pragma once
/// \file
/// load_verification: what one load verifies and how, decided from the plan and the digests
/// before any read (verify_options.hpp has the policy), and the re-read check of the tensors
/// that cannot be hashed where they landed.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/log.hpp"
#include "eredu/engine/backend/verifying_backend.hpp"
#include "eredu/engine/description/weight_binding.hpp"
#include "eredu/engine/orchestration/verify_options.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/integrity/checksums.hpp"

namespace eredu::engine::detail {

/// The verification of one load: per owner, the check of its delivered bytes (if it is
/// hashed in place); the tensors hashed again from the file; the counts for reports.
struct LoadVerification {
  std::vector<std::optional<io::DigestCheck>> in_place;  ///< by owner index
  io::Checksums reread;                                  ///< checked by re-reading the file
  std::uint64_t reread_bytes = 0;                        ///< the bytes those checks read again
  std::uint64_t tensors = 0;                             ///< distinct checkpoint tensors read
  std::uint64_t unverified = 0;                          ///< of those, not verifiable
  std::string first_unverified;                          ///< one of them, for messages
  std::string why_unverified;                            ///< why that one is not verifiable
};

/// Adds `check` (of a whole tensor or of a shard) to the checks made by re-reading the file.
inline void reread(LoadVerification& out, const io::DigestCheck& check) {
  io::Checksums& into = out.reread;
  out.reread_bytes += check.bytes;
  if (check.selection.is_all())
    into.add(check.tensor, check.kind, check.expected);
  else
    into.add_shard(check.tensor, check.selection, check.kind, check.expected);
}

/// Decides what the load of `owners` verifies (see verify_options.hpp). Throws
/// Error(invalid_argument) for options out of range (validate), under VerifyMode::require when a tensor read is not
/// verifiable, and the digests' own errors (tensor_not_found...). Logs one line under `on` when nothing or not
/// everything will be verified, unless `quiet`.
template <class B>
LoadVerification plan_verification(const VerifyOptions& options, const io::Catalog& catalog,
                                   const std::vector<const WeightBinding*>& owners, bool quiet = false) {
  validate(options);
  LoadVerification out;
  out.in_place.resize(owners.size());
  if (options.mode == VerifyMode::off) return out;
  const io::Checksums metadata = options.checksums.empty() ? io::Checksums::from_metadata(catalog) : io::Checksums{};
  const io::Checksums& digests = options.checksums.empty() ? metadata : options.checksums;
  std::set<std::string> seen, unverified;
  // Records one tensor (or one piece of it) read; returns its check when it is verifiable. A
  // tensor counts as unverified once, when any piece of it is (a fused tensor's pieces each
  // need their own shard digest).
  auto note = [&](const std::string& key, const Selection& selection) -> std::optional<io::DigestCheck> {
    if (seen.insert(key).second) ++out.tensors;
    // A key the catalog lacks is the load's own error (tensor_not_found), not verification's.
    if (catalog.find(key) == nullptr) return std::nullopt;
    std::optional<io::DigestCheck> check = digests.check(catalog, key, selection, options.preferred);
    if (!check && unverified.insert(key).second && out.unverified++ == 0) {
      out.first_unverified = key;
      out.why_unverified = selection.is_all() ? "no digest is recorded for it"
                                              : fmt::format(
                                                    "it is read partially (shard {}) and no digest of that shard is "
                                                    "recorded (`eredu checksum PATH --tensor-parallel N` records them)",
                                                    selection.to_string());
    }
    return check;
  };
  for (std::size_t i = 0; i < owners.size(); ++i) {
    const WeightBinding& owner = *owners[i];
    if (const DerivedWeightRecipe* recipe = owner.recipe()) {
      // Sources of a recipe are converted or rearranged on the way: check the file's bytes.
      std::vector<const DerivedWeightRecipe*> todo{recipe};
      while (!todo.empty()) {
        const DerivedWeightRecipe* node = todo.back();
        todo.pop_back();
        if (node->kind() == DerivedWeightRecipe::Kind::source) {
          if (auto check = note(node->key(), node->selection())) reread(out, *check);
        } else {
          for (const DerivedWeightRecipe& input : node->inputs()) todo.push_back(&input);
        }
      }
    } else if (auto check = note(owner.checkpoint_key(), owner.selection())) {
      if constexpr (VerifyingBackend<B>) {
        out.in_place[i] = std::move(check);
      } else {
        reread(out, *check);
      }
    }
  }
  if (options.mode == VerifyMode::require && out.unverified > 0) {
    throw Error(errc::invalid_argument, {.tensor = out.first_unverified},
                fmt::format("verification is required but this tensor cannot be verified: {} ({} of the {} "
                            "tensors read cannot be verified)",
                            out.why_unverified, out.unverified, out.tensors));
  }
  if (!quiet && out.unverified == out.tensors && out.tensors > 0) {
    log::warn(
        "verification on, but none of the {} tensors this load reads can be verified ({}, e.g. {}): nothing "
        "is verified",
        out.tensors, out.why_unverified, out.first_unverified);
  } else if (!quiet && out.unverified > 0) {
    log::info("verifying {} of the {} tensors this load reads; the others cannot be ({}, e.g. {})",
              out.tensors - out.unverified, out.tensors, out.why_unverified, out.first_unverified);
  }
  return out;
}

}  // namespace eredu::engine::detail
