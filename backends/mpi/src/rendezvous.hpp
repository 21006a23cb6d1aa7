#pragma once
// Joining two separately started MPI jobs (private to eredu::mpi): the blocking steps of
// MPI_Open_port/MPI_Comm_accept on one side and MPI_Lookup_name/MPI_Comm_connect on the other,
// each bounded by a timeout although MPI's calls have none (OpenMPI 4.1 waits forever in both).
// Communicator::accept and Communicator::connect wrap the joined communicator in a handle.

#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>

#include "eredu/mpi/communicator.hpp"

namespace eredu::mpi::detail {

/// Which side of the rendezvous this job is.
enum class JoinSide { accept, connect };

/// Joins the job of `local` (a private communicator of this job: nothing else runs on it while
/// this does) with the job on the other side of `service`, and returns the merged
/// intracommunicator, the accepting job's ranks first. Every rank of `local` calls it. Needs
/// MPI_THREAD_MULTIPLE: the steps run on helper threads beside the progress thread, so that a
/// step that outlives `timeout` can be abandoned. Throws CollectiveError: timed_out when the
/// other job did not come in time, collective_error when MPI refused a step.
MPI_Comm join_jobs(Communicator& local, JoinSide side, const std::string& service, std::chrono::milliseconds timeout);

}  // namespace eredu::mpi::detail
