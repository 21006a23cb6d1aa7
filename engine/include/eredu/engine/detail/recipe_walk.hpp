#pragma once
/// \file
/// The walk behind evaluate_recipe (recipe_evaluator.hpp): one recursive coroutine that
/// makes every folding decision and calls the backend's RecipeOps primitives. Not for
/// direct use; include recipe_evaluator.hpp.
///
/// g++ 12: no class temporary is written inside a co_await expression (see io.md); regions,
/// requests and names are named locals first.

#include <asio/awaitable.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "eredu/core/error.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "eredu/engine/description/recipe_evaluator.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/reading/tensor_read_request.hpp"

namespace eredu::engine::detail {

/// Product of `shape`'s dimensions before `dim`: 1 exactly when every input of a concat along
/// `dim` is one contiguous block of its output.
inline std::uint64_t outer_count(const Shape& shape, std::size_t dim) {
  std::uint64_t outer = 1;
  for (std::size_t d = 0; d < dim; ++d) outer *= shape[d];
  return outer;
}

/// The selection of `source` narrowed along `dim` to `range` (indices of the source's own
/// selection): the read a slice of a source folds into.
inline Selection folded_slice(const io::Catalog& catalog, const DerivedWeightRecipe& source, std::size_t dim,
                              Range range) {
  std::vector<Range> ranges = source.selection().ranges;
  if (ranges.empty())
    for (auto d : catalog.at(source.key()).shape) ranges.push_back({0, d});
  Range& r = ranges[dim];
  r = {r.start + range.start, r.start + range.stop};
  return Selection{std::move(ranges)};
}

template <RecipeOps Ops>
asio::awaitable<void> eval_into(Ops& ops, const DerivedWeightRecipe& node, typename Ops::Region out) {
  using Kind = DerivedWeightRecipe::Kind;
  const io::Catalog& catalog = ops.catalog();
  if (ops.stop_requested()) throw stopped_error(node.to_string());
  switch (node.kind()) {
    case Kind::source: {
      io::TensorReadRequest request{node.key(), node.selection()};
      co_await ops.read_into(request, out);
      co_return;
    }
    case Kind::reshape:
      // Row-major bytes do not change under a reshape.
      co_await eval_into(ops, node.inputs()[0], out);
      co_return;
    case Kind::cast: {
      const DerivedWeightRecipe& child = node.inputs()[0];
      const InferredWeight in = child.infer(catalog);
      const DType to = node.dtype();
      if (in.dtype == to) {
        co_await eval_into(ops, child, out);
        co_return;
      }
      const std::string what = node.to_string();
      if (!Ops::supports_cast(in.dtype, to))
        throw BackendError(
            errc::recipe_unsupported_cast, {.tensor = what},
            fmt::format("the {} backend cannot convert {} to {}", Ops::name, dtype_name(in.dtype), dtype_name(to)));
      if (child.kind() == Kind::source) {
        // The backend's own best path: no temporary the walk knows of.
        io::TensorReadRequest request{child.key(), child.selection()};
        co_await ops.cast_source(request, in, to, out, what);
        co_return;
      }
      typename Ops::Temporary tmp = ops.temporary(in, what);
      typename Ops::Region into = Ops::region(tmp);
      co_await eval_into(ops, child, into);
      co_await ops.convert(std::move(tmp), in, to, out, what);
      co_return;
    }
    case Kind::slice: {
      const DerivedWeightRecipe& child = node.inputs()[0];
      if (child.kind() == Kind::source) {
        // Fold the slice into the read's selection: only the sliced bytes are read.
        io::TensorReadRequest request{child.key(), folded_slice(catalog, child, node.dim(), node.range())};
        co_await ops.read_into(request, out);
        co_return;
      }
      const InferredWeight in = child.infer(catalog);
      const std::string what = node.to_string();
      typename Ops::Temporary tmp = ops.temporary(in, what);
      typename Ops::Region into = Ops::region(tmp);
      co_await eval_into(ops, child, into);
      co_await ops.copy_slice(std::move(tmp), in, node.dim(), node.range(), out, what);
      co_return;
    }
    case Kind::concat: {
      const InferredWeight whole = node.infer(catalog);
      if (outer_count(whole.shape, node.dim()) == 1) {
        // Each input is one contiguous block of the output: evaluate it in its place.
        std::size_t offset = 0;
        for (const DerivedWeightRecipe& child : node.inputs()) {
          const std::size_t bytes = child.infer(catalog).bytes;
          typename Ops::Region part = Ops::subregion(out, offset, bytes);
          co_await eval_into(ops, child, part);
          offset += bytes;
        }
        co_return;
      }
      const std::string what = node.to_string();
      typename Ops::ConcatJoin join = ops.begin_concat(whole, node.dim(), out, what);
      for (const DerivedWeightRecipe& child : node.inputs()) {
        const InferredWeight part = child.infer(catalog);
        typename Ops::Temporary tmp = ops.temporary(part, what);
        typename Ops::Region into = Ops::region(tmp);
        co_await eval_into(ops, child, into);
        co_await join.add(std::move(tmp), part);
      }
      co_await join.finish();
      co_return;
    }
    case Kind::permute: {
      const DerivedWeightRecipe& child = node.inputs()[0];
      const InferredWeight in = child.infer(catalog);
      const std::string what = node.to_string();
      if (in.shape.size() > Ops::max_permute_rank)
        throw BackendError(errc::backend_failure, {.tensor = what},
                           fmt::format("the {} backend permutes up to rank {}, not rank {}", Ops::name,
                                       std::size_t{Ops::max_permute_rank}, in.shape.size()));
      typename Ops::Temporary tmp = ops.temporary(in, what);
      typename Ops::Region into = Ops::region(tmp);
      co_await eval_into(ops, child, into);
      // permutation() resolves a transpose of a rank only known from the catalog.
      const std::vector<std::size_t> order = node.permutation(in.shape.size());
      co_await ops.permute(std::move(tmp), in, order, out, what);
      co_return;
    }
  }
}

}  // namespace eredu::engine::detail
