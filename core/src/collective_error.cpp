#include "eredu/core/collective_error.hpp"

#include <utility>

#include <fmt/format.h>

namespace eredu {
namespace {

std::string compose(const CollectiveContext& c, const std::string& detail) {
  std::string out = c.operation.empty() ? std::string("collective") : c.operation;
  if (!c.group.empty()) fmt::format_to(std::back_inserter(out), " on group '{}'", c.group);
  if (c.rank >= 0) fmt::format_to(std::back_inserter(out), " (rank {} of {})", c.rank, c.size);
  fmt::format_to(std::back_inserter(out), ": {}", detail);
  return out;
}

}  // namespace

CollectiveError::CollectiveError(errc kind, CollectiveContext context, const std::string& detail)
    : Error(kind, context.where, compose(context, detail)), collective_(std::move(context)) {}

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  return fmt::format("{}", fmt::join(ranks, ", "));
}

}  // namespace eredu
