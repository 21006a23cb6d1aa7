#pragma once
/// \file
/// evaluate_recipe<Ops>: the one walk of a DerivedWeightRecipe tree, for every backend. The
/// walk makes the folding decisions; a backend supplies the primitives, as a type that
/// satisfies RecipeOps (in the spirit of ggml's backend interface: small, explicit, with
/// one `supports_cast` as ggml has `supports_op`).
///
/// What the walk decides, once for all backends (every node first checks the stop request):
///  * `source`: read the selection straight into the destination (read_into);
///  * `reshape`, and a `cast` to the input's own dtype: the same bytes, evaluated in place;
///  * `slice` of a source: folded into the read's selection, so only the sliced bytes are
///    read; of anything else: the input into a temporary, then copy_slice;
///  * `concat` whose dimensions before `dim` are all 1 (the outer dim, or below size-1 dims):
///    each input is one contiguous block of the output and is evaluated in its place; any
///    other concat: each input into a temporary, handed in order to the backend's ConcatJoin;
///  * `cast` of a source: one primitive, cast_source, which each backend implements its own
///    best way (the CPU converts from the page cache or streams bounded chunks; CUDA stages
///    on the device); of anything else: the input into a temporary, then convert. A cast the
///    backend's supports_cast refuses fails with BackendError(recipe_unsupported_cast)
///    before anything is read;
///  * `permute`: the input into a temporary, then permute with the order resolved for the
///    input's rank; ranks above Ops::max_permute_rank fail with BackendError(backend_failure)
///    before anything is read.
///
/// Temporaries are moved into the primitive that consumes them, which keeps them alive
/// until its work has completed (a backend whose work outlives the awaitable retains them
/// with eredu::retain_until_complete). The engine stays backend-neutral: primitives are
/// Asio awaitables, regions and temporaries are the backend's own types.

#include <asio/awaitable.hpp>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "eredu/core/dtype.hpp"
#include "eredu/core/error.hpp"
#include "eredu/core/selection.hpp"
#include "eredu/engine/description/recipe.hpp"
#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/reading/tensor_read_request.hpp"

namespace eredu::engine {

/// The backend primitives evaluate_recipe runs a recipe with. Regions are destinations the
/// primitives write: exactly the bytes of the value written there (a span of host memory, a
/// device address). All awaitables complete when the bytes are written (or the work failed,
/// throwing its error); none may complete earlier.
///
/// Types and constants:
/// - `Ops::Region`: a writable destination; `Ops::subregion(r, offset, bytes)` is a part of it;
/// - `Ops::Temporary`: an owned intermediate buffer, `Ops::region(t)` its bytes;
/// - `Ops::ConcatJoin`: joins the inputs of a concat the walk could not place in the output;
/// - `Ops::name`: the backend in messages ("CPU"); `Ops::max_permute_rank`: highest rank permute accepts.
///
/// Members of an `ops` object (one per realization):
/// - `catalog()`, `stop_requested()`: the checkpoint, and whether the unit asked to stop;
/// - `supports_cast(from, to)` (static): the backend has a kernel for the cast;
/// - `temporary(weight, what)`: a buffer for a value of `weight`'s dtype and shape;
/// - `read_into(request, out)`: the request's selected bytes, dtype kept;
/// - `cast_source(request, weight, to, out)`: the selected source (dtype and shape `weight`)
///   converted to `to`;
/// - `convert(tmp, weight, to, out)`, `copy_slice(tmp, weight, dim, range, out)`,
///   `permute(tmp, weight, order, out)`: `tmp` (a value of `weight`) converted, sliced along
///   `dim`, or with its dimensions reordered (output dim i is input dim order[i]);
/// - `begin_concat(whole, dim, out)`, then `join.add(tmp, weight)` per input in order, then
///   `join.finish()`: the inputs joined along `dim` into `out` (`whole` is the result).
///
/// `what` names the node in errors (its to_string()). Primitives throw eredu::Error.
template <class Ops>
concept RecipeOps = requires {
  typename Ops::Region;
  typename Ops::Temporary;
  typename Ops::ConcatJoin;
  { Ops::name } -> std::convertible_to<std::string_view>;
  { Ops::max_permute_rank } -> std::convertible_to<std::size_t>;
}
&&requires(Ops& ops, typename Ops::Region out, typename Ops::Temporary temporary, typename Ops::ConcatJoin& join,
           const io::TensorReadRequest& request, const InferredWeight& weight, DType dtype, std::size_t n, Range range,
           std::span<const std::size_t> order, const std::string& what) {
  { ops.catalog() } -> std::same_as<const io::Catalog&>;
  { ops.stop_requested() } -> std::same_as<bool>;
  { Ops::supports_cast(dtype, dtype) } -> std::same_as<bool>;
  { Ops::subregion(out, n, n) } -> std::same_as<typename Ops::Region>;
  { Ops::region(std::as_const(temporary)) } -> std::same_as<typename Ops::Region>;
  { ops.temporary(weight, what) } -> std::same_as<typename Ops::Temporary>;
  { ops.read_into(request, out) } -> std::same_as<asio::awaitable<void>>;
  { ops.cast_source(request, weight, dtype, out, what) } -> std::same_as<asio::awaitable<void>>;
  { ops.convert(std::move(temporary), weight, dtype, out, what) } -> std::same_as<asio::awaitable<void>>;
  { ops.copy_slice(std::move(temporary), weight, n, range, out, what) } -> std::same_as<asio::awaitable<void>>;
  { ops.permute(std::move(temporary), weight, order, out, what) } -> std::same_as<asio::awaitable<void>>;
  { ops.begin_concat(weight, n, out, what) } -> std::same_as<typename Ops::ConcatJoin>;
  { join.add(std::move(temporary), weight) } -> std::same_as<asio::awaitable<void>>;
  { join.finish() } -> std::same_as<asio::awaitable<void>>;
};

/// The error a realization ends with when its unit told it to stop (another weight of the
/// unit failed, or the load was cancelled): Error(cancelled) naming `what`.
inline Error stopped_error(const std::string& what) {
  return Error(errc::cancelled, {.tensor = what}, "stopped because another weight of the unit failed");
}

namespace detail {
/// The walk itself (detail/recipe_walk.hpp).
template <RecipeOps Ops>
asio::awaitable<void> eval_into(Ops& ops, const DerivedWeightRecipe& node, typename Ops::Region out);
}  // namespace detail

/// Writes the value of `recipe` into `out`, which holds exactly recipe.infer(ops.catalog())
/// bytes, by the decisions in the file comment. The recipe must have been inferred against
/// the catalog (materialize_recipe does that first). Completes when every byte is written;
/// fails with the first primitive's error, RecipeError from inference, BackendError
/// (recipe_unsupported_cast, backend_failure), or Error(cancelled) when ops.stop_requested()
/// at a node. `ops` and `recipe` must outlive the returned awaitable.
template <RecipeOps Ops>
asio::awaitable<void> evaluate_recipe(Ops& ops, const DerivedWeightRecipe& recipe, typename Ops::Region out) {
  return detail::eval_into(ops, recipe, std::move(out));
}

}  // namespace eredu::engine

// The walk's definition, kept apart from the interface (as Asio keeps impl/ headers).
#include "eredu/engine/detail/recipe_walk.hpp"
