#pragma once
// What the backend conformance suite (backend_conformance.hpp) needs to know of a backend: a
// small adapter per backend, defined in that backend's conformance .cpp. An adapter is a
// struct that derives from ConformanceDefaults<B> and adds:
//
//   static constexpr const char* name;     // "cpu": how the WARN of an unavailable backend names it
//   static constexpr bool transfer;        // the backend claims TransferBackend
//   static constexpr bool in_place;        // the backend claims InPlaceBackend
//   static constexpr bool collective;      // the backend claims CollectiveBackend
//   static constexpr bool gather_into;     // the backend claims GatherIntoBackend
//   static std::string unavailable();      // "" where it can run; otherwise why not ("no CUDA
//                                          // device (...)"): every runtime case WARNs and returns
//   struct Env {                           // made per case, after the source, destroyed before it
//     Env(asio::io_context&, io::CheckpointSource&);
//     typename B::MaterializationContext& context();  // what materializations run with
//     typename B::Executor& executor();               // transfers, overwrites, submissions
//   };
//   static std::vector<std::byte> host_bytes(const W&);  // a completed weight's bytes, on the host
//   static const void* address(const W&);                // where those bytes live (in place = same)
//
// and, where `collective` is true (the collective cases run over a group of one rank, so they
// run in a plain process; B::Tensor must be B::MaterializedWeight, since their inputs are
// materialized from the checkpoint):
//
//   static constexpr std::array<DType, N> reduced_dtypes;  // what all_reduce takes, by the backend's
//                                                          // documentation (with sum, min and max)
//   static constexpr std::array<DType, M> refused_dtypes;  // what it documents as refused with every
//                                                          // reduction: Error(invalid_argument)
//   typename B::Group& Env::group();                       // a group of one rank, made by the Env
//
// Each dtype listed must be one of the suite's tensors (backend_conformance.hpp's specs()).
//
// ConformanceDefaults supplies the rest from the vocabulary eredu's backends share — weights
// with dtype(), shape() and shares_storage_with(), parameters with a (DType, Shape)
// constructor and a `value` member — and an adapter whose backend spells them differently
// hides these with its own.

#include <cstddef>
#include <string>
#include <vector>

#include "eredu/core/dtype.hpp"
#include "eredu/core/shape.hpp"

namespace eredu::test {

/// The parts of a conformance adapter that follow from the shared backend vocabulary (see
/// file comment).
template <class B>
struct ConformanceDefaults {
  /// The backend under test.
  using Backend = B;
  /// Its realized weight.
  using Weight = typename B::MaterializedWeight;
  /// Its parameter slot.
  using Parameter = typename B::Parameter;

  /// Element type of a weight.
  static DType dtype(const Weight& w) { return w.dtype(); }
  /// Shape of a weight.
  static Shape shape(const Weight& w) { return w.shape(); }
  /// True when two weights are handles to the same storage.
  static bool same_storage(const Weight& a, const Weight& b) { return a.shares_storage_with(b); }
  /// A slot accepting `dtype` × `shape`, unbound.
  static Parameter parameter(DType dtype, Shape shape) { return Parameter(dtype, std::move(shape)); }
  /// The weight bound to a slot (empty when unbound).
  static const Weight& bound(const Parameter& p) { return p.value; }
  /// True when a slot holds a weight.
  static bool is_bound(const Parameter& p) { return static_cast<bool>(p.value); }
};

}  // namespace eredu::test
