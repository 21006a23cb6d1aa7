#pragma once
/// \file
/// eredu::mpi::LiveTransport: how a live update's subscribers read the publisher's bytes. A
/// publisher and its subscribers must choose the same one (both make or skip the window
/// together).

namespace eredu::mpi {

/// How subscribers read a published version's bytes.
enum class LiveTransport {
  /// MPI_Rget from a dynamic window over the publisher's memory: the publisher's CPU takes no
  /// part in a read. The default.
  one_sided,
  /// Each read is a request the publisher answers with the bytes (MPI_Isend of a copy). For
  /// ranks a window cannot reach: two jobs joined over TCP with OpenMPI 4.1.
  two_sided,
};

/// "one_sided" or "two_sided".
constexpr const char* live_transport_name(LiveTransport t) noexcept {
  return t == LiveTransport::one_sided ? "one_sided" : "two_sided";
}

}  // namespace eredu::mpi
