#pragma once
/// \file
/// A group decision: every rank of a group casts a small fixed-size Ballot, one all_gather
/// brings every ballot to every rank, and each rank decides from the same gathered ballots —
/// so every rank reaches the same decision without a coordinator. This is the vote of a
/// distributed swap (distributed_model_slot.hpp).
///
/// Why an all_gather of whole ballots rather than an all_reduce of a flag: a failed rank's
/// cause (its error kind and message) travels with its vote, so every rank can say which rank
/// failed and why, and the ranks agree on more than yes/no (the serving generation, the
/// step at which a new version starts) in the same round trip.

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "eredu/core/completion.hpp"
#include "eredu/core/error.hpp"
#include "eredu/engine/backend/collective_backend.hpp"

namespace eredu::engine {

/// A collective backend that can also gather host bytes (ballots) over a group.
///
/// - `C::gather_ballots(group, bytes, timeout)`: every rank's `bytes` (all of one size), in
///   rank order, in a buffer returned at once and readable once the Completion has succeeded.
///   The wait may be long — ranks vote when their loads end, minutes apart for big shards — so
///   it has its own `timeout`, and the backend waits for it without spinning. Never throws: a
///   failure or timeout fails the completion (CollectiveError).
template <class C>
concept VotingBackend = CollectiveBackend<C> &&
    requires(typename C::Group& group, std::vector<std::byte> bytes, std::chrono::milliseconds timeout) {
  {
    C::gather_ballots(group, std::move(bytes), timeout)
    } -> std::same_as<std::pair<std::shared_ptr<const std::vector<std::byte>>, Completion>>;
};

/// One rank's vote. Trivially copyable and sent as raw bytes: every rank of a group runs the
/// same build, which `magic` and `size` check (a ballot from another layout is refused, not
/// misread).
struct Ballot {
  static constexpr std::uint32_t expected_magic = 0x42445245;  ///< "ERDB"
  std::uint32_t magic = expected_magic;                        ///< identifies an eredu ballot
  std::uint32_t size = sizeof(Ballot);                         ///< the sender's layout size
  std::uint32_t ok = 0;                                        ///< 1: this rank is ready to commit
  std::int32_t kind = 0;                                       ///< the failure's errc (when !ok)
  std::uint64_t serving = 0;                                   ///< generation this rank serves
  std::uint64_t previous = 0;                                  ///< generation this rank keeps for rollback (0: none)
  std::uint64_t highest = 0;                                   ///< highest generation this rank has ever committed
  std::uint64_t fence = 0;          ///< first step this rank has not begun (it begins none until the decision)
  std::array<char, 448> message{};  ///< the failure's message, cut to fit, NUL-terminated

  /// Records `error` as this rank's failure: its errc (backend_failure for a foreign
  /// exception) and its message.
  void fail(const std::exception_ptr& error) noexcept {
    ok = 0;
    kind = static_cast<std::int32_t>(errc::backend_failure);
    std::string_view what = "unknown exception";
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      kind = static_cast<std::int32_t>(e.kind());
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {}
    set_message(what);
  }

  /// Sets the message, cut to fit.
  void set_message(std::string_view text) noexcept {
    const std::size_t n = std::min(text.size(), message.size() - 1);
    std::memcpy(message.data(), text.data(), n);
    message[n] = '\0';
  }

  /// The message.
  std::string_view text() const noexcept {
    return {message.data(),
            static_cast<std::size_t>(std::find(message.begin(), message.end(), '\0') - message.begin())};
  }

  /// True when this ballot came from a rank of the same layout.
  bool well_formed() const noexcept { return magic == expected_magic && size == sizeof(Ballot); }
};
static_assert(std::is_trivially_copyable_v<Ballot>);

namespace detail {

/// The ballots of a finished vote, by rank, parsed from the gathered bytes; a ballot of
/// another layout is returned zeroed with well_formed() false.
inline std::vector<Ballot> parse_ballots(std::span<const std::byte> gathered, int size) {
  std::vector<Ballot> out(static_cast<std::size_t>(size));
  for (std::size_t r = 0; r < out.size(); ++r) {
    if (gathered.size() < (r + 1) * sizeof(Ballot)) {
      out[r].magic = 0;
      continue;
    }
    std::memcpy(&out[r], gathered.data() + r * sizeof(Ballot), sizeof(Ballot));
  }
  return out;
}

/// Casts `mine` on `group`, waiting at most `timeout` for the others, and calls
/// `decide(error, ballots)` on the thread that completes the gather (the backend's progress
/// thread: `decide` must only do bookkeeping).
template <VotingBackend C, class Decide>
void cast_vote(typename C::Group& group, const Ballot& mine, std::chrono::milliseconds timeout, Decide decide) {
  const auto* first = reinterpret_cast<const std::byte*>(&mine);
  auto [gathered, done] = C::gather_ballots(group, std::vector<std::byte>(first, first + sizeof mine), timeout);
  const int size = C::group_size(group);
  done.on_complete(
      [decide = std::move(decide), gathered = std::move(gathered), size](std::exception_ptr error) mutable {
        if (error) {
          decide(std::move(error), std::vector<Ballot>{});
          return;
        }
        decide(nullptr, parse_ballots(*gathered, size));
      });
}

}  // namespace detail

}  // namespace eredu::engine
