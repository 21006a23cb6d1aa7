#!/usr/bin/env bash
# Runs the MPI tests across two separately started jobs that join through MPI's name server, as
# a trainer job and an inference job do: an ompi-server, a job of ACCEPTORS ranks that offers a
# service, and a job of CONNECTORS ranks that joins it. Each test binary makes the joined
# communicator its world (EREDU_TEST_JOIN, see mpi_main.cpp), accepting ranks first.
#
# With EREDU_TWO_JOBS_STALE=1, a job that crashed after offering the service comes first: one
# that offers it and exits without withdrawing it (the name server keeps it). The connecting
# job then starts before the accepting one, so that it first finds that dead offer.
#
# usage: two_jobs.sh OMPI_SERVER MPIEXEC ACCEPTORS CONNECTORS TEST_BINARY FILTER [MPIEXEC FLAGS...]
# Exit 77 (ctest: skipped) when OMPI_SERVER is not an executable.
set -u
server_bin=$1 mpiexec=$2 acceptors=$3 connectors=$4 binary=$5 filter=$6
shift 6
if [[ ! -x $server_bin ]]; then
  echo "skipped: no ompi-server ($server_bin), which joining two OpenMPI jobs needs"
  exit 77
fi
dir=$(mktemp -d)
server=
cleanup() {
  [[ -n $server ]] && kill "$server" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
"$server_bin" --no-daemonize -r "$dir/uri" &
server=$!
for _ in $(seq 100); do [[ -s $dir/uri ]] && break; sleep 0.1; done
if [[ ! -s $dir/uri ]]; then
  echo "ompi-server wrote no address within 10 s"
  exit 1
fi
service="eredu-two-jobs-$$"
if [[ ${EREDU_TWO_JOBS_STALE:-} == 1 ]]; then
  EREDU_TEST_STALE_SERVICE=$service "$mpiexec" "$@" --ompi-server "file:$dir/uri" -np 1 "$binary" || exit 1
  EREDU_TEST_JOIN="connect:$service" "$mpiexec" "$@" --ompi-server "file:$dir/uri" -np "$connectors" \
    "$binary" "$filter" &
  connecting=$!
  sleep 1
  EREDU_TEST_JOIN="accept:$service" "$mpiexec" "$@" --ompi-server "file:$dir/uri" -np "$acceptors" \
    "$binary" "$filter"
  accepting_rc=$?
  wait "$connecting"
  connecting_rc=$?
else
  EREDU_TEST_JOIN="accept:$service" "$mpiexec" "$@" --ompi-server "file:$dir/uri" -np "$acceptors" \
    "$binary" "$filter" &
  accepting=$!
  EREDU_TEST_JOIN="connect:$service" "$mpiexec" "$@" --ompi-server "file:$dir/uri" -np "$connectors" \
    "$binary" "$filter"
  connecting_rc=$?
  wait "$accepting"
  accepting_rc=$?
fi
echo "two jobs joined as '$service': the accepting job exited $accepting_rc, the connecting job $connecting_rc"
[[ $accepting_rc == 0 && $connecting_rc == 0 ]]
