#pragma once
/// \file
/// The io::LeaseStream concept: a sequence of bounded chunk leases covering one read request,
/// in order, for tensors larger than a source's staging budget. CheckpointSource's
/// ChunkStream models it; any io::ByteSource returns one from `stream()`.

#include <asio/awaitable.hpp>
#include <asio/use_awaitable.hpp>
#include <concepts>
#include <cstdint>
#include <optional>

#include "eredu/io/reading/lease.hpp"

namespace eredu::io {

/// Bounded chunk leases of one request, handed out in order; an empty optional after the
/// last. Move-only in practice; one async_next at a time.
template <class C>
concept LeaseStream = std::movable<C> && requires(C& chunks, const C& const_chunks) {
  // Bytes the request selects in all.
  { const_chunks.total() } -> std::same_as<std::uint64_t>;
  // Bytes not yet handed out.
  { const_chunks.remaining() } -> std::same_as<std::uint64_t>;
  // The next chunk (an Asio initiating function; any completion token, awaitable shown).
  { chunks.async_next(asio::use_awaitable) } -> std::same_as<asio::awaitable<std::optional<Lease>>>;
};

}  // namespace eredu::io
