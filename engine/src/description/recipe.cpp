#include "eredu/engine/description/recipe.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "eredu/core/error.hpp"
#include "eredu/engine/orchestration/engine_error.hpp"

namespace eredu::engine {

using Kind = DerivedWeightRecipe::Kind;

// One immutable node. Fields of other kinds stay at their defaults.
struct DerivedWeightRecipe::Node {
  Kind kind = Kind::source;
  std::string key;                          // source
  Selection selection;                      // source
  std::size_t dim = 0;                      // slice, concat
  Range range;                              // slice
  std::vector<DerivedWeightRecipe> inputs;  // all but source
  std::vector<std::size_t> order;           // permute
  bool swap_last_two = false;               // permute made by transpose() of unknown rank
  Shape shape;                              // reshape
  DType dtype{};                            // cast
};

namespace {

// The rank of a recipe's result when it follows from the recipe alone (no catalog).
std::optional<std::size_t> static_rank(const DerivedWeightRecipe& r) {
  switch (r.kind()) {
    case Kind::source:
      if (r.selection().is_all()) return std::nullopt;
      return r.selection().ranges.size();
    case Kind::reshape:
      return r.shape().size();
    case Kind::permute:
      if (!r.swaps_last_two()) return r.order().size();
      return static_rank(r.inputs()[0]);
    case Kind::concat:
      for (const auto& in : r.inputs()) {
        if (auto rank = static_rank(in)) return rank;
      }
      return std::nullopt;
    case Kind::slice:
    case Kind::cast:
      return static_rank(r.inputs()[0]);
  }
  return std::nullopt;
}

std::vector<std::size_t> last_two_swapped(std::size_t rank) {
  std::vector<std::size_t> order(rank);
  for (std::size_t i = 0; i < rank; ++i) order[i] = i;
  if (rank >= 2) std::swap(order[rank - 1], order[rank - 2]);
  return order;
}

// ---- inference ----

// An inferred subtree plus the tensor its errors are attributed to (its first source).
struct Inferred {
  InferredWeight weight;
  std::string tensor;
  std::string file;
};

std::string label(const DerivedWeightRecipe& r) {
  switch (r.kind()) {
    case Kind::source:
      return fmt::format("source '{}'", r.key());
    case Kind::permute:
      return r.swaps_last_two() ? "transpose" : "permute";
    default:
      return recipe_kind_name(r.kind());
  }
}

[[noreturn]] void fail(errc kind, const std::string& tensor, const std::string& file, const std::string& path,
                       const std::string& what) {
  throw RecipeError(kind, {.file = file, .tensor = tensor}, fmt::format("recipe {}: {}", path, what));
}

[[noreturn]] void fail(errc kind, const Inferred& origin, const std::string& path, const std::string& what) {
  fail(kind, origin.tensor, origin.file, path, what);
}

std::uint64_t byte_size(const Shape& shape, DType dtype, const Inferred& origin, const std::string& path) {
  auto elements = checked_element_count(shape);
  if (!elements) {
    fail(errc::recipe_shape_mismatch, origin, path,
         fmt::format("shape {} has more than 2^64 elements", format_shape(shape)));
  }
  if (auto why = block_shape_error(shape, dtype); !why.empty()) fail(errc::recipe_cuts_block, origin, path, why);
  auto bytes = checked_byte_size(*elements, dtype);
  if (!bytes && dtype_is_quantized(dtype)) {
    fail(errc::recipe_shape_mismatch, origin, path,
         fmt::format("{} elements of {} (shape {}) overflow 64-bit size arithmetic", *elements, dtype_name(dtype),
                     format_shape(shape)));
  }
  if (!bytes) {
    std::uint64_t bits = 0;
    const bool overflow = __builtin_mul_overflow(*elements, std::uint64_t{dtype_bits(dtype)}, &bits);
    fail(errc::recipe_shape_mismatch, origin, path,
         fmt::format("{} elements of {} ({} bits each, shape {}) {}", *elements, dtype_name(dtype), dtype_bits(dtype),
                     format_shape(shape),
                     overflow ? "overflow 64-bit size arithmetic" : "are not a whole number of bytes"));
  }
  return *bytes;
}

// Sub-byte floats have no whole-byte unit to move; quantized dtypes move whole blocks, and
// each layout node checks that it cuts none.
bool sub_byte(DType t) { return !dtype_is_quantized(t) && dtype_bits(t) < 8; }

void require_whole_bytes(const Inferred& in, const std::string& path, std::string_view op) {
  const DType t = in.weight.dtype;
  if (sub_byte(t)) {
    fail(errc::recipe_sub_byte_layout, in, path,
         fmt::format("{} of a {} input ({}-bit elements, shape {}): layout recipes need whole-byte elements", op,
                     dtype_name(t), dtype_bits(t), format_shape(in.weight.shape)));
  }
}

Inferred infer_at(const DerivedWeightRecipe& r, const io::Catalog& catalog, const std::string& path);

std::string child_path(const std::string& path, const DerivedWeightRecipe& parent, std::size_t i,
                       const DerivedWeightRecipe& child) {
  if (parent.kind() == Kind::concat) return fmt::format("{}[{}] > {}", path, i, label(child));
  return fmt::format("{} > {}", path, label(child));
}

Inferred infer_source(const DerivedWeightRecipe& r, const io::Catalog& catalog, const std::string& path) {
  const io::TensorInfo* t = catalog.find(r.key());
  if (!t) {
    const auto files = catalog.files();
    fail(errc::recipe_unknown_key, r.key(), files.size() == 1 ? files.front().path : std::string{}, path,
         fmt::format("the checkpoint has no tensor '{}' (it has {} tensors in {} files)", r.key(), catalog.size(),
                     files.size()));
  }
  Inferred out{{t->dtype, {}, 0}, t->name, catalog.file_of(*t).path};
  const Selection& sel = r.selection();
  if (auto why = sel.check(t->shape); !why.empty()) {
    fail(errc::recipe_invalid_selection, out, path,
         fmt::format("selection {} does not fit the tensor's shape {}: {}", sel.to_string(), format_shape(t->shape),
                     why));
  }
  if (auto why = selection_block_error(t->shape, t->dtype, sel); !why.empty()) {
    fail(errc::recipe_cuts_block, out, path,
         fmt::format("selection {} of a {} tensor of shape {}: {}", sel.to_string(), dtype_name(t->dtype),
                     format_shape(t->shape), why));
  }
  if (!sel.is_all() && sub_byte(t->dtype)) {
    fail(errc::recipe_sub_byte_layout, out, path,
         fmt::format("selection {} of a {} tensor of shape {}: {}-bit elements are only read whole", sel.to_string(),
                     dtype_name(t->dtype), format_shape(t->shape), dtype_bits(t->dtype)));
  }
  out.weight.shape = sel.selected_shape(t->shape);
  out.weight.bytes = byte_size(out.weight.shape, t->dtype, out, path);
  return out;
}

Inferred infer_slice(const DerivedWeightRecipe& r, Inferred in, const std::string& path) {
  require_whole_bytes(in, path, "slice");
  Shape& shape = in.weight.shape;
  const std::size_t dim = r.dim();
  if (dim >= shape.size()) {
    fail(errc::recipe_bad_dim, in, path,
         fmt::format("dim {} is out of range for the input's shape {} (rank {})", dim, format_shape(shape),
                     shape.size()));
  }
  const Range range = r.range();
  if (range.start > range.stop || range.stop > shape[dim]) {
    fail(errc::recipe_bad_dim, in, path,
         fmt::format("range {}:{} does not fit dim {} of size {} (input shape {})", range.start, range.stop, dim,
                     shape[dim], format_shape(shape)));
  }
  if (dtype_is_quantized(in.weight.dtype) && dim + 1 == shape.size()) {
    const std::uint32_t per_block = dtype_block(in.weight.dtype).elements;
    if (range.start % per_block != 0 || range.stop % per_block != 0) {
      fail(
          errc::recipe_cuts_block, in, path,
          fmt::format("range {}:{} of the last dim (input shape {}) cuts {} blocks of {} values: it must start and "
                      "stop on a multiple of {}",
                      range.start, range.stop, format_shape(shape), dtype_name(in.weight.dtype), per_block, per_block));
    }
  }
  shape[dim] = range.size();
  in.weight.bytes = byte_size(shape, in.weight.dtype, in, path);
  return in;
}

Inferred infer_concat(const DerivedWeightRecipe& r, const io::Catalog& catalog, const std::string& path) {
  const auto inputs = r.inputs();
  if (inputs.empty()) fail(errc::recipe_shape_mismatch, {}, {}, path, "concat of no inputs has no shape");
  std::vector<Inferred> in;
  in.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    in.push_back(infer_at(inputs[i], catalog, child_path(path, r, i, inputs[i])));
  const Inferred& first = in.front();
  for (std::size_t i = 1; i < in.size(); ++i) {
    if (in[i].weight.dtype != first.weight.dtype) {
      fail(errc::recipe_dtype_mismatch, in[i], path,
           fmt::format("input {} is {} but input 0 is {}", i, dtype_name(in[i].weight.dtype),
                       dtype_name(first.weight.dtype)));
    }
  }
  require_whole_bytes(first, path, "concat");
  const Shape& shape0 = first.weight.shape;
  for (std::size_t i = 1; i < in.size(); ++i) {
    if (in[i].weight.shape.size() != shape0.size()) {
      fail(errc::recipe_rank_mismatch, in[i], path,
           fmt::format("input {} has shape {} (rank {}) but input 0 has {} (rank {})", i,
                       format_shape(in[i].weight.shape), in[i].weight.shape.size(), format_shape(shape0),
                       shape0.size()));
    }
  }
  const std::size_t dim = r.dim();
  if (dim >= shape0.size()) {
    fail(errc::recipe_bad_dim, first, path,
         fmt::format("dim {} is out of range for inputs of rank {} (input 0 has shape {})", dim, shape0.size(),
                     format_shape(shape0)));
  }
  Shape out = shape0;
  for (std::size_t i = 1; i < in.size(); ++i) {
    const Shape& s = in[i].weight.shape;
    for (std::size_t d = 0; d < s.size(); ++d) {
      if (d != dim && s[d] != shape0[d]) {
        fail(errc::recipe_shape_mismatch, in[i], path,
             fmt::format("input {} has shape {} but input 0 has {}: dim {} differs ({} vs {}), and only dim {} may", i,
                         format_shape(s), format_shape(shape0), d, s[d], shape0[d], dim));
      }
    }
    if (__builtin_add_overflow(out[dim], s[dim], &out[dim])) {
      fail(errc::recipe_shape_mismatch, in[i], path,
           fmt::format("dim {} overflows 64 bits when input {} (shape {}) is added", dim, i, format_shape(s)));
    }
  }
  Inferred result{{first.weight.dtype, std::move(out), 0}, first.tensor, first.file};
  result.weight.bytes = byte_size(result.weight.shape, result.weight.dtype, result, path);
  return result;
}

Inferred infer_permute(const DerivedWeightRecipe& r, Inferred in, const std::string& path) {
  require_whole_bytes(in, path, r.swaps_last_two() ? "transpose" : "permute");
  const Shape& shape = in.weight.shape;
  const std::size_t rank = shape.size();
  if (r.swaps_last_two() && rank < 2) {
    fail(errc::recipe_rank_mismatch, in, path,
         fmt::format("transpose needs rank 2 or more but the input has shape {} (rank {})", format_shape(shape), rank));
  }
  const std::vector<std::size_t> order = r.permutation(rank);
  if (order.size() != rank) {
    fail(errc::recipe_rank_mismatch, in, path,
         fmt::format("order [{}] has {} entries but the input has shape {} (rank {})", fmt::join(order, ", "),
                     order.size(), format_shape(shape), rank));
  }
  std::vector<bool> seen(rank, false);
  for (auto d : order) {
    if (d >= rank || seen[d]) {
      fail(errc::recipe_bad_dim, in, path,
           fmt::format("order [{}] is not a permutation of 0..{} (entry {} {})", fmt::join(order, ", "), rank - 1, d,
                       d >= rank ? "is out of range" : "repeats"));
    }
    seen[d] = true;
  }
  if (dtype_is_quantized(in.weight.dtype) && rank > 0 && order.back() != rank - 1) {
    fail(errc::recipe_cuts_block, in, path,
         fmt::format("order [{}] moves the last dim of a {} input (shape {}): its values are stored in blocks of {} "
                     "along that dim, so only the other dims may be reordered",
                     fmt::join(order, ", "), dtype_name(in.weight.dtype), format_shape(shape),
                     dtype_block(in.weight.dtype).elements));
  }
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) out[i] = shape[order[i]];
  in.weight.shape = std::move(out);
  return in;
}

Inferred infer_reshape(const DerivedWeightRecipe& r, Inferred in, const std::string& path) {
  const Shape& target = r.shape();
  auto target_count = checked_element_count(target);
  if (!target_count) {
    fail(errc::recipe_shape_mismatch, in, path,
         fmt::format("target shape {} has more than 2^64 elements", format_shape(target)));
  }
  // The input's count was checked when its bytes were inferred.
  const std::uint64_t count = *checked_element_count(in.weight.shape);
  if (*target_count != count) {
    fail(errc::recipe_shape_mismatch, in, path,
         fmt::format("cannot reshape {} ({} elements) to {} ({} elements)", format_shape(in.weight.shape), count,
                     format_shape(target), *target_count));
  }
  if (auto why = block_shape_error(target, in.weight.dtype); !why.empty()) {
    fail(errc::recipe_cuts_block, in, path,
         fmt::format("cannot reshape {} of {} to {}: {}", format_shape(in.weight.shape), dtype_name(in.weight.dtype),
                     format_shape(target), why));
  }
  in.weight.shape = target;
  return in;
}

Inferred infer_cast(const DerivedWeightRecipe& r, Inferred in, const std::string& path) {
  const DType to = r.dtype();
  if (!is_supported_cast(in.weight.dtype, to)) {
    fail(errc::recipe_unsupported_cast, in, path,
         fmt::format("cast from {} to {} is not supported (supported: {})", dtype_name(in.weight.dtype), dtype_name(to),
                     supported_casts_text));
  }
  in.weight.dtype = to;
  in.weight.bytes = byte_size(in.weight.shape, to, in, path);
  return in;
}

Inferred infer_at(const DerivedWeightRecipe& r, const io::Catalog& catalog, const std::string& path) {
  switch (r.kind()) {
    case Kind::source:
      return infer_source(r, catalog, path);
    case Kind::concat:
      return infer_concat(r, catalog, path);
    default:
      break;
  }
  const DerivedWeightRecipe& input = r.inputs()[0];
  Inferred in = infer_at(input, catalog, child_path(path, r, 0, input));
  switch (r.kind()) {
    case Kind::slice:
      return infer_slice(r, std::move(in), path);
    case Kind::permute:
      return infer_permute(r, std::move(in), path);
    case Kind::reshape:
      return infer_reshape(r, std::move(in), path);
    case Kind::cast:
      return infer_cast(r, std::move(in), path);
    case Kind::source:
    case Kind::concat:
      break;
  }
  throw std::logic_error("unreachable recipe kind");
}

void collect_keys(const DerivedWeightRecipe& r, std::unordered_set<std::string_view>& seen,
                  std::vector<std::string>& out) {
  if (r.kind() == Kind::source) {
    if (seen.insert(r.key()).second) out.push_back(r.key());
    return;
  }
  for (const auto& in : r.inputs()) collect_keys(in, seen, out);
}

void append_string(const DerivedWeightRecipe& r, std::string& out) {
  auto inputs_then_close = [&] {
    for (const auto& in : r.inputs()) {
      out += ", ";
      append_string(in, out);
    }
    out += ')';
  };
  switch (r.kind()) {
    case Kind::source:
      fmt::format_to(std::back_inserter(out), "source('{}'", r.key());
      if (!r.selection().is_all()) fmt::format_to(std::back_inserter(out), ", {}", r.selection().to_string());
      out += ')';
      return;
    case Kind::slice:
      fmt::format_to(std::back_inserter(out), "slice(dim={}, {}:{}", r.dim(), r.range().start, r.range().stop);
      break;
    case Kind::concat:
      fmt::format_to(std::back_inserter(out), "concat(dim={}", r.dim());
      break;
    case Kind::permute:
      if (r.swaps_last_two()) {
        out += "transpose(";
        append_string(r.inputs()[0], out);
        out += ')';
        return;
      }
      fmt::format_to(std::back_inserter(out), "permute(order=[{}]", fmt::join(r.order(), ", "));
      break;
    case Kind::reshape:
      fmt::format_to(std::back_inserter(out), "reshape({}", format_shape(r.shape()));
      break;
    case Kind::cast:
      fmt::format_to(std::back_inserter(out), "cast({}", dtype_name(r.dtype()));
      break;
  }
  inputs_then_close();
}

}  // namespace

const char* recipe_kind_name(DerivedWeightRecipe::Kind kind) noexcept {
  switch (kind) {
    case Kind::source:
      return "source";
    case Kind::slice:
      return "slice";
    case Kind::concat:
      return "concat";
    case Kind::permute:
      return "permute";
    case Kind::reshape:
      return "reshape";
    case Kind::cast:
      return "cast";
  }
  return "unknown";
}

// ---- factories ----

DerivedWeightRecipe DerivedWeightRecipe::source(std::string key, Selection selection) {
  auto node = std::make_shared<Node>();
  node->kind = Kind::source;
  node->key = std::move(key);
  node->selection = std::move(selection);
  return DerivedWeightRecipe(std::move(node));
}

DerivedWeightRecipe DerivedWeightRecipe::slice(DerivedWeightRecipe input, std::size_t dim, Range range) {
  auto node = std::make_shared<Node>();
  node->kind = Kind::slice;
  node->dim = dim;
  node->range = range;
  node->inputs.push_back(std::move(input));
  return DerivedWeightRecipe(std::move(node));
}

DerivedWeightRecipe DerivedWeightRecipe::concat(std::vector<DerivedWeightRecipe> inputs, std::size_t dim) {
  auto node = std::make_shared<Node>();
  node->kind = Kind::concat;
  node->dim = dim;
  node->inputs = std::move(inputs);
  return DerivedWeightRecipe(std::move(node));
}

DerivedWeightRecipe DerivedWeightRecipe::permute(DerivedWeightRecipe input, std::vector<std::size_t> order) {
  auto node = std::make_shared<Node>();
  node->kind = Kind::permute;
  node->order = std::move(order);
  node->inputs.push_back(std::move(input));
  return DerivedWeightRecipe(std::move(node));
}

DerivedWeightRecipe DerivedWeightRecipe::transpose(DerivedWeightRecipe input) {
  if (auto rank = static_rank(input); rank && *rank >= 2) return permute(std::move(input), last_two_swapped(*rank));
  // Unknown rank (or a rank infer() will reject): record the intent and resolve it later.
  auto node = std::make_shared<Node>();
  node->kind = Kind::permute;
  node->order = {1, 0};
  node->swap_last_two = true;
  node->inputs.push_back(std::move(input));
  return DerivedWeightRecipe(std::move(node));
}

DerivedWeightRecipe DerivedWeightRecipe::reshape(DerivedWeightRecipe input, Shape shape) {
  auto node = std::make_shared<Node>();
  node->kind = Kind::reshape;
  node->shape = std::move(shape);
  node->inputs.push_back(std::move(input));
  return DerivedWeightRecipe(std::move(node));
}

DerivedWeightRecipe DerivedWeightRecipe::cast(DerivedWeightRecipe input, DType dtype) {
  auto node = std::make_shared<Node>();
  node->kind = Kind::cast;
  node->dtype = dtype;
  node->inputs.push_back(std::move(input));
  return DerivedWeightRecipe(std::move(node));
}

// ---- accessors ----

const DerivedWeightRecipe::Node& DerivedWeightRecipe::expect(Kind k, const char* accessor) const {
  if (node_->kind != k) {
    throw std::logic_error(fmt::format("DerivedWeightRecipe::{}() called on a {} node ({})", accessor,
                                       recipe_kind_name(node_->kind), to_string()));
  }
  return *node_;
}

DerivedWeightRecipe::Kind DerivedWeightRecipe::kind() const noexcept { return node_->kind; }
const std::string& DerivedWeightRecipe::key() const { return expect(Kind::source, "key").key; }
const Selection& DerivedWeightRecipe::selection() const { return expect(Kind::source, "selection").selection; }
std::size_t DerivedWeightRecipe::dim() const {
  return node_->kind == Kind::concat ? node_->dim : expect(Kind::slice, "dim").dim;
}
Range DerivedWeightRecipe::range() const { return expect(Kind::slice, "range").range; }
std::span<const DerivedWeightRecipe> DerivedWeightRecipe::inputs() const noexcept { return node_->inputs; }
std::span<const std::size_t> DerivedWeightRecipe::order() const { return expect(Kind::permute, "order").order; }
bool DerivedWeightRecipe::swaps_last_two() const noexcept { return node_->swap_last_two; }
const Shape& DerivedWeightRecipe::shape() const { return expect(Kind::reshape, "shape").shape; }
DType DerivedWeightRecipe::dtype() const { return expect(Kind::cast, "dtype").dtype; }

std::vector<std::size_t> DerivedWeightRecipe::permutation(std::size_t rank) const {
  const Node& n = expect(Kind::permute, "permutation");
  if (n.swap_last_two) return last_two_swapped(rank);
  return n.order;
}

// ---- whole-tree operations ----

InferredWeight DerivedWeightRecipe::infer(const io::Catalog& catalog) const {
  return infer_at(*this, catalog, label(*this)).weight;
}

std::vector<std::string> DerivedWeightRecipe::source_keys() const {
  std::unordered_set<std::string_view> seen;
  std::vector<std::string> out;
  collect_keys(*this, seen, out);
  return out;
}

std::string DerivedWeightRecipe::to_string() const {
  std::string out;
  append_string(*this, out);
  return out;
}

bool operator==(const DerivedWeightRecipe& a, const DerivedWeightRecipe& b) noexcept {
  if (a.node_ == b.node_) return true;
  const auto& x = *a.node_;
  const auto& y = *b.node_;
  return x.kind == y.kind && x.key == y.key && x.selection == y.selection && x.dim == y.dim && x.range == y.range &&
         x.order == y.order && x.swap_last_two == y.swap_last_two && x.shape == y.shape && x.dtype == y.dtype &&
         x.inputs == y.inputs;
}

}  // namespace eredu::engine
