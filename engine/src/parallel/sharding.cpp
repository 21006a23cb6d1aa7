#include "eredu/engine/parallel/sharding.hpp"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/description/parameter_id.hpp"
#include "eredu/engine/description/recipe.hpp"

namespace eredu::engine {
namespace {

[[noreturn]] void invalid(const std::string& tensor, const std::string& detail) {
  throw Error(errc::invalid_argument, {.tensor = tensor}, detail);
}

std::uint64_t bytes_of(const Shape& shape, DType dtype, const std::string& tensor) {
  const std::optional<std::uint64_t> elements = checked_element_count(shape);
  const std::optional<std::uint64_t> bytes = elements ? checked_byte_size(*elements, dtype) : std::nullopt;
  if (!bytes)
    throw Error(errc::size_overflow, {.tensor = tensor},
                fmt::format("{} {} overflows", dtype_name(dtype), format_shape(shape)));
  return *bytes;
}

/// A selection of `shape` with `range` along `dim`, every other dimension whole.
Selection along(const Shape& shape, std::size_t dim, Range range) {
  Selection s;
  for (std::size_t d = 0; d < shape.size(); ++d) s.ranges.push_back(d == dim ? range : Range{0, shape[d]});
  return s;
}

bool set_match(std::string_view pattern, std::size_t& p, char c) noexcept {
  // pattern[p] == '['; on return p is past the closing ']'. A set without ']' matches '['.
  std::size_t q = p + 1;
  bool negate = false;
  if (q < pattern.size() && pattern[q] == '!') {
    negate = true;
    ++q;
  }
  bool matched = false;
  bool first = true;
  while (q < pattern.size() && (pattern[q] != ']' || first)) {
    first = false;
    if (q + 2 < pattern.size() && pattern[q + 1] == '-' && pattern[q + 2] != ']') {
      if (pattern[q] <= c && c <= pattern[q + 2]) matched = true;
      q += 3;
    } else {
      if (pattern[q] == c) matched = true;
      ++q;
    }
  }
  if (q >= pattern.size()) {  // no closing bracket: a literal '['
    ++p;
    return c == '[';
  }
  p = q + 1;
  return matched != negate;
}

}  // namespace

const char* replicated_reads_name(ReplicatedReads reads) noexcept {
  switch (reads) {
    case ReplicatedReads::every_rank:
      return "read";
    case ReplicatedReads::gather:
      return "gather";
  }
  return "unknown";
}

Shard Shard::replicated() { return Shard(); }

Shard Shard::split(std::size_t dim, std::uint64_t granule) {
  Shard s;
  s.kind_ = Kind::split;
  s.dim_ = dim;
  s.granule_ = granule;
  return s;
}

Shard Shard::fused(std::size_t dim, std::vector<std::uint64_t> parts, std::uint64_t granule) {
  Shard s = split(dim, granule);
  s.kind_ = Kind::fused;
  s.parts_ = std::move(parts);
  return s;
}

Shard Shard::fused_even(std::size_t dim, std::size_t count, std::uint64_t granule) {
  Shard s = split(dim, granule);
  s.kind_ = Kind::fused;
  s.even_parts_ = count;
  return s;
}

std::string Shard::to_string() const {
  switch (kind_) {
    case Kind::replicated:
      return "replicated";
    case Kind::split:
      return fmt::format("split(dim={}, granule={})", dim_, granule_);
    case Kind::fused:
      if (even_parts_ > 0) return fmt::format("fused(dim={}, {} equal parts, granule={})", dim_, even_parts_, granule_);
      return fmt::format("fused(dim={}, parts=[{}], granule={})", dim_, fmt::join(parts_, ", "), granule_);
  }
  return "unknown";
}

Range shard_range(std::uint64_t extent, std::uint64_t granule, int rank, int size, std::string_view what) {
  const std::string name(what);
  if (size < 1 || rank < 0 || rank >= size)
    invalid(name, fmt::format("rank {} of {} is not a rank of the group", rank, size));
  if (granule == 0) invalid(name, "a shard's granule must be at least 1");
  if (extent % granule != 0)
    invalid(name, fmt::format("the divided dimension has {} indices, not a multiple of the unit of {} (give the "
                              "head size as the granule)",
                              extent, granule));
  const std::uint64_t units = extent / granule;
  const auto n = static_cast<std::uint64_t>(size);
  const auto r = static_cast<std::uint64_t>(rank);
  if (units >= n) {
    const std::uint64_t base = units / n, extra = units % n;
    const std::uint64_t start = r * base + std::min(r, extra);
    const std::uint64_t count = base + (r < extra ? 1 : 0);
    return {start * granule, (start + count) * granule};
  }
  if (units > 0 && n % units == 0) {  // fewer units than ranks: each on n / units ranks
    const std::uint64_t unit = r / (n / units);
    return {unit * granule, (unit + 1) * granule};
  }
  invalid(name, fmt::format("{} units of {} cannot be divided among {} ranks (fewer units than ranks, and not a "
                            "divisor of their number)",
                            units, granule, size));
}

bool glob_match(std::string_view pattern, std::string_view name) noexcept {
  // Iterative matching with one backtracking point per '*' (the last one seen), which is
  // enough for globs: a later '*' can absorb whatever an earlier one would have.
  std::size_t p = 0, n = 0;
  std::size_t star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
      continue;
    }
    if (p < pattern.size()) {
      std::size_t next = p;
      bool ok = false;
      if (pattern[p] == '?') {
        ok = true;
        next = p + 1;
      } else if (pattern[p] == '[') {
        ok = set_match(pattern, next, name[n]);
      } else {
        ok = pattern[p] == name[n];
        next = p + 1;
      }
      if (ok) {
        p = next;
        ++n;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    p = star + 1;
    n = ++resume;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

ShardingRules& ShardingRules::add(std::string pattern, Shard shard) {
  rules_.emplace_back(std::move(pattern), std::move(shard));
  return *this;
}

ShardingRules& ShardingRules::otherwise(std::optional<Shard> shard) {
  fallback_ = std::move(shard);
  return *this;
}

std::optional<Shard> ShardingRules::find(std::string_view name) const {
  for (const auto& [pattern, shard] : rules_)
    if (glob_match(pattern, name)) return shard;
  return fallback_;
}

ShardingRules ShardingRules::llama(const LlamaSharding& dims) {
  ShardingRules rules;
  rules.add("*.self_attn.[qkv]_proj.weight", Shard::column_parallel(dims.head_dim))
      .add("*.self_attn.[qkv]_proj.bias", Shard::column_parallel(dims.head_dim))
      .add("*.self_attn.o_proj.weight", Shard::row_parallel(dims.head_dim));
  if (dims.heads > 0 && dims.kv_heads > 0) {
    const std::vector<std::uint64_t> parts = {dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim,
                                              dims.kv_heads * dims.head_dim};
    rules.add("*.self_attn.qkv_proj.weight", Shard::fused(0, parts, dims.head_dim))
        .add("*.self_attn.qkv_proj.bias", Shard::fused(0, parts, dims.head_dim));
  }
  rules.add("*.mlp.gate_proj.weight", Shard::column_parallel())
      .add("*.mlp.up_proj.weight", Shard::column_parallel())
      .add("*.mlp.gate_up_proj.weight", Shard::fused_even(0, 2))
      .add("*.mlp.down_proj.weight", Shard::row_parallel())
      .add("model.embed_tokens.weight", dims.vocab_parallel ? Shard::split(0) : Shard::replicated())
      .add("lm_head.weight", Shard::column_parallel())
      .otherwise(Shard::replicated());
  return rules;
}

TensorParallelPlan plan_tensor_parallel(const io::Catalog& catalog, const ShardingRules& rules, int rank, int size,
                                        ReplicatedReads replicated) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(errc::invalid_argument, {},
                fmt::format("rank {} of {} is not a rank of a tensor-parallel group", rank, size));
  if (replicated != ReplicatedReads::every_rank && replicated != ReplicatedReads::gather)
    throw Error(errc::invalid_argument, {},
                fmt::format("ReplicatedReads value {} is not one of its enumerators", static_cast<int>(replicated)));
  TensorParallelPlan plan;
  plan.rank = rank;
  plan.size = size;
  plan.replicated_reads = replicated;
  std::vector<WeightBinding> bindings;
  std::size_t index = 0;
  for (const io::TensorInfo& t : catalog.tensors()) {
    ShardedTensor s;
    s.key = t.name;
    s.parameter = ParameterId::parse(t.name) ? t.name : fmt::format("tensor_{}", index);
    ++index;
    s.dtype = t.dtype;
    s.full_shape = t.shape;
    const std::optional<Shard> shard = rules.find(t.name);
    if (!shard) invalid(t.name, "no sharding rule matches this tensor and the rules have no fallback");
    s.shard = *shard;
    const bool whole_bytes = dtype_bits(t.dtype) % 8 == 0;
    const std::string what = fmt::format("{} ({})", t.name, s.shard.to_string());

    if (s.shard.kind() == Shard::Kind::replicated) {
      s.local_shape = t.shape;
      // Gathered only when the blocks are equal and whole bytes (see the header's rule):
      // an all_gather of equal shapes is then the tensor, with no padding to cut out.
      s.gathered = replicated == ReplicatedReads::gather && size > 1 && !t.shape.empty() && whole_bytes &&
                   t.nbytes > 0 && t.shape[0] % static_cast<std::uint64_t>(size) == 0;
      if (s.gathered)
        s.pieces.push_back(along(t.shape, 0, shard_range(t.shape[0], 1, rank, size, what)));
      else
        s.pieces.push_back(Selection::all());
    } else {
      const std::size_t dim = s.shard.dim();
      if (dim >= t.shape.size())
        invalid(t.name, fmt::format("{} divides dim {} but the tensor is {} {}", s.shard.to_string(), dim,
                                    dtype_name(t.dtype), format_shape(t.shape)));
      if (!whole_bytes)
        invalid(t.name, fmt::format("a {} tensor cannot be divided: its elements are narrower than a byte",
                                    dtype_name(t.dtype)));
      const std::uint64_t extent = t.shape[dim];
      std::vector<std::uint64_t> parts;
      if (s.shard.kind() == Shard::Kind::split) {
        parts = {extent};
      } else if (s.shard.even_parts() > 0) {
        const std::uint64_t count = s.shard.even_parts();
        if (extent % count != 0)
          invalid(t.name, fmt::format("{}: dim {} has {} indices, which {} equal parts do not divide",
                                      s.shard.to_string(), dim, extent, count));
        parts.assign(count, extent / count);
      } else {
        parts = s.shard.parts();
        const std::uint64_t total = std::accumulate(parts.begin(), parts.end(), std::uint64_t{0});
        if (parts.empty() || total != extent)
          invalid(t.name, fmt::format("{}: the parts add up to {} but dim {} has {} indices", s.shard.to_string(),
                                      total, dim, extent));
      }
      std::uint64_t offset = 0, local = 0;
      for (const std::uint64_t part : parts) {
        const Range r = shard_range(part, s.shard.granule(), rank, size, what);
        s.pieces.push_back(along(t.shape, dim, {offset + r.start, offset + r.stop}));
        local += r.size();
        offset += part;
      }
      s.local_shape = t.shape;
      s.local_shape[dim] = local;
    }

    for (const Selection& piece : s.pieces)
      s.read_bytes += bytes_of(piece.is_all() ? t.shape : piece.selected_shape(t.shape), t.dtype, t.name);
    const std::uint64_t bound = bytes_of(s.local_shape, t.dtype, t.name);
    if (s.shard.kind() == Shard::Kind::replicated)
      plan.replicated_bytes += t.nbytes;
    else
      plan.split_bytes += t.nbytes;
    if (s.gathered) {
      plan.gathered_bytes += t.nbytes;
      plan.gather_received_bytes += t.nbytes - s.read_bytes;
      ++plan.gathered_tensors;
    } else if (s.shard.kind() == Shard::Kind::replicated) {
      ++plan.whole_replicated_tensors;
    }
    plan.read_bytes += s.read_bytes;
    plan.bound_bytes += bound;

    if (s.pieces.size() == 1) {
      bindings.push_back(WeightBinding::tensor(s.parameter, t.name, s.pieces.front(), s.read_bytes));
    } else {
      std::vector<DerivedWeightRecipe> inputs;
      for (const Selection& piece : s.pieces) inputs.push_back(DerivedWeightRecipe::source(t.name, piece));
      bindings.push_back(WeightBinding::from_recipe(
          s.parameter, DerivedWeightRecipe::concat(std::move(inputs), s.shard.dim()), bound));
    }
    plan.tensors.push_back(std::move(s));
  }
  plan.bindings = WeightBindingPlan(std::move(bindings));
  return plan;
}

}  // namespace eredu::engine
