#pragma once
/// \file
/// The io::ByteSource concept: what the engine and a backend may ask of any source of
/// checkpoint bytes (a local file set, an object store, a trainer's memory): its catalog,
/// reads of byte ranges as Asio completions — into caller memory, into one bounded lease,
/// or as a stream of bounded chunk leases — and the optional capabilities it declares in a
/// SourceCapabilities.
///
/// Optional capabilities (mapping pages, page-aligned direct windows) are still members every
/// model has, so generic code compiles against any source; a source without one declares it
/// false in capabilities() and its member answers std::nullopt (or fails with
/// invalid_argument). Callers decide from capabilities() which members are worth asking
/// (engine::plan_placement does), never by probing. The members that may answer std::nullopt
/// do so also when a capable source cannot serve this request now (a cold page, an unaligned
/// run): capabilities say what a source can ever do, the answers what it can do now.

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/use_awaitable.hpp>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "eredu/io/formats/catalog.hpp"
#include "eredu/io/mapping/mapped_tensor.hpp"
#include "eredu/io/mapping/mapped_view.hpp"
#include "eredu/io/reading/lease.hpp"
#include "eredu/io/reading/lease_stream.hpp"
#include "eredu/io/reading/tensor_read_request.hpp"

namespace eredu::io {

/// What a byte source declares it can do beyond plain reads, and how it likes to be read.
/// A default-constructed one is a source that only reads (the safe answer for a new source).
struct SourceCapabilities {
  /// map_tensor and map_resident can answer mappings of the source's pages (a local file in
  /// a page cache the source trusts); false: they always answer std::nullopt.
  bool maps_pages = false;
  /// direct_window and async_read_window_into can serve page-aligned windows read straight
  /// to the caller's memory (O_DIRECT); false: direct_window always answers std::nullopt.
  bool direct_windows = false;
  /// Alignment a direct window's memory needs (0 without direct windows).
  std::size_t window_alignment = 0;
  /// Size of one request the source serves best (0: no preference).
  std::size_t request_bytes = 0;
  /// Requests the source serves best in flight at once (at least 1).
  unsigned concurrency = 1;
  /// Every failure to supply a byte surfaces as an error, never as bytes that silently
  /// differ (false: a backing store that may hand back zeros for a failed read; callers
  /// must then not hold its pages where no read checks them).
  bool trusted_errors = true;
};

/// Where a selection lies in the page-aligned window of its file that a direct read of it
/// covers (ByteSource::direct_window).
struct DirectWindow {
  std::uint64_t lead = 0;   ///< window bytes before the selection's first byte
  std::uint64_t bytes = 0;  ///< the window's size, whole alignment units
};

/// A source of checkpoint bytes (see file comment). Reads are Asio initiating functions
/// taking any completion token (the awaitable one shown); their errors are eredu::Error
/// naming tensor and offset. The source must outlive its operations, leases and streams.
template <class S>
concept ByteSource = requires(S& source, const S& const_source, const TensorReadRequest& request,
                              std::span<std::byte> memory) {
  // Executor completions run on when a handler has none of its own.
  { const_source.get_executor() } -> std::convertible_to<asio::any_io_executor>;
  // The tensors the source serves.
  { const_source.catalog() } -> std::same_as<const Catalog&>;
  // What the source can do beyond plain reads (see SourceCapabilities).
  { const_source.capabilities() } -> std::same_as<SourceCapabilities>;
  // Bytes a request selects; throws tensor_not_found / invalid_selection.
  { const_source.selected_bytes(request) } -> std::same_as<std::uint64_t>;
  // The request's bytes into one bounded lease (waits for staging memory).
  { source.async_read(request, asio::use_awaitable) } -> std::same_as<asio::awaitable<Lease>>;
  // The request's bytes into caller memory of exactly the selected size.
  { source.async_read_into(request, memory, asio::use_awaitable) } -> std::same_as<asio::awaitable<void>>;
  // The request's bytes as bounded chunk leases, for selections larger than the budget.
  { source.stream(request) } -> LeaseStream;

  // --- optional: SourceCapabilities::maps_pages ---
  // The selection's pages mapped to be held as weight storage, or std::nullopt.
  { const_source.map_tensor(request) } -> std::same_as<std::optional<MappedTensor>>;
  // The selection's pages mapped for one pass when resident in memory, or std::nullopt.
  { const_source.map_resident(request) } -> std::same_as<std::optional<MappedView>>;

  // --- optional: SourceCapabilities::direct_windows ---
  // The page-aligned window a direct read of the selection covers, or std::nullopt.
  { const_source.direct_window(request) } -> std::same_as<std::optional<DirectWindow>>;
  // That window read into caller memory of its size and window_alignment.
  { source.async_read_window_into(request, memory, asio::use_awaitable) } -> std::same_as<asio::awaitable<void>>;
};

}  // namespace eredu::io
