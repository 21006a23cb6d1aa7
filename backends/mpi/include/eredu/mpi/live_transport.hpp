#pragma once
/// \file
/// eredu::mpi::LiveTransport: how a live update's subscribers read the publisher's bytes. A
/// publisher and its subscribers must choose the same one (both make or skip the window
/// together). Two-sided requests are the default: every wait on the publisher then ends
/// within the subscriber's timeout, even when the publisher dies in the middle of a read,
/// where one-sided reads under OpenMPI 4.1 can wait forever (docs/live_updates.md).

namespace eredu::mpi {

/// How subscribers read a published version's bytes.
enum class LiveTransport {
  /// MPI_Rget from a dynamic window over the publisher's memory: the publisher's CPU takes no
  /// part in a read, and a full update is faster; but a publisher that dies during a read can
  /// hold the subscriber's MPI progress forever (OpenMPI 4.1's osc/rdma).
  one_sided,
  /// Each read is a request the publisher answers with the bytes (MPI_Isend), received within
  /// the subscriber's timeout. The default; also the one that reaches two jobs joined over TCP.
  two_sided,
};

/// "one_sided" or "two_sided".
constexpr const char* live_transport_name(LiveTransport t) noexcept {
  return t == LiveTransport::one_sided ? "one_sided" : "two_sided";
}

}  // namespace eredu::mpi
