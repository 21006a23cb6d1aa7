#pragma once
/// \file
/// eredu::CollectiveError: the typed error of everything that involves more than one rank — a
/// collective (all_reduce, all_gather, all_to_all) that failed, timed out or found its group
/// unusable (errc::collective_error), and a group decision that a rank failed its part of (a
/// distributed swap's vote: errc::rank_failed).
///
/// Besides what every eredu::Error says, it names the operation, the group, this rank, the
/// ranks concerned (those that did not answer, or that failed) and, for a vote, each failed
/// rank's own error kind and message, so every rank of a group reports the same cause:
///
/// \code
///   vote on group 'tp' (rank 0 of 2): rank 1 failed: model-1.safetensors: tensor 'w': ...
///   checksum mismatch [checksum_mismatch]; every rank keeps generation 3 [rank_failed]
/// \endcode

#include <string>
#include <vector>

#include "eredu/core/error.hpp"

namespace eredu {

/// One rank's failure as a group decision saw it.
struct RankFailure {
  int rank = -1;                       ///< the rank in the group
  errc kind = errc::collective_error;  ///< that rank's own error kind
  std::string message{};               ///< that rank's own error message (what())
  friend bool operator==(const RankFailure&, const RankFailure&) = default;
};

/// What a CollectiveError concerns, beyond eredu::ErrorContext.
struct CollectiveContext {
  std::string operation{};              ///< "all_reduce", "all_gather", "vote", "split", ...
  std::string group{};                  ///< the group's name ("world", "tp")
  int rank = -1;                        ///< this process's rank in the group
  int size = 0;                         ///< ranks in the group
  std::vector<int> ranks{};             ///< the ranks concerned (unresponsive, dead or failed)
  std::vector<RankFailure> failures{};  ///< rank_failed: each failed rank's cause
  ErrorContext where{};                 ///< file, tensor, parameter the operation concerns, if any
};

/// A failure across ranks (see file comment); family() == error_family::collective.
class CollectiveError : public Error {
 public:
  /// Composes "<operation> on group '<group>' (rank r of n): <detail>" after the context's
  /// file and tensor, as every eredu::Error message does.
  CollectiveError(errc kind, CollectiveContext context, const std::string& detail);

  /// The operation that failed.
  const std::string& operation() const noexcept { return collective_.operation; }
  /// The group it ran on.
  const std::string& group() const noexcept { return collective_.group; }
  /// This process's rank in the group.
  int rank() const noexcept { return collective_.rank; }
  /// Ranks in the group.
  int size() const noexcept { return collective_.size; }
  /// The ranks concerned: unresponsive or dead ones for a collective, failed ones for a vote.
  const std::vector<int>& ranks() const noexcept { return collective_.ranks; }
  /// For a vote (rank_failed): each failed rank's own kind and message, by rank.
  const std::vector<RankFailure>& failures() const noexcept { return collective_.failures; }
  /// Everything above at once.
  const CollectiveContext& collective() const noexcept { return collective_; }

 private:
  CollectiveContext collective_;
};

/// "0, 2, 3" for messages; "none" for an empty list.
std::string rank_list(const std::vector<int>& ranks);

}  // namespace eredu
