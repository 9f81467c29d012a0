#!/usr/bin/env bash
# tests/mpirun.sh [--expect-failure | --expect-status N] HAVE_MPI NP PROGRAM [ARGS...]
# Runs PROGRAM as NP ranks under Open MPI's mpirun, bounded by a timeout. Exit 77 (meson's
# "skipped") when mpirun is missing or the build has no MPI (HAVE_MPI is "true" or "false").
# CI runs as root, which Open MPI refuses unless told; a 2-core machine needs --oversubscribe
# (tests/mpi_env.sh, which also prepares sanitized builds).
# --expect-failure: the job must end with a non-zero status before the timeout (a rank that
# dies must stop the others, never hang them). --expect-status N: the job must end with status N
# before the timeout (na_dist_abort's code: mpirun exits with it).
set -u
expect_failure=false expect_status=
if [ "${1:-}" = --expect-failure ]; then expect_failure=true; shift; fi
if [ "${1:-}" = --expect-status ]; then expect_status=$2; shift 2; fi
have_mpi=$1 np=$2
shift 2
if [ "$have_mpi" != true ]; then echo "built without MPI (-Ddist): skipped"; exit 77; fi
if ! command -v mpirun >/dev/null; then echo "mpirun not found: skipped"; exit 77; fi
. "$(dirname "$0")/mpi_env.sh"
# one BLAS thread per rank: two ranks on two cores
export OPENBLAS_NUM_THREADS=1 NANOAMP_NO_BLAS_TUNE=1
limit=${MPIRUN_TIMEOUT:-240}
timeout -k 10 "$limit" mpirun --oversubscribe -np "$np" "$@"
rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "mpirun: still running after ${limit}s (a hang)"
    exit 1
fi
if [ -n "$expect_status" ]; then
    if [ "$rc" != "$expect_status" ]; then echo "mpirun: status $rc, expected $expect_status"; exit 1; fi
    echo "mpirun: the job ended with status $rc as expected within ${limit}s"
    exit 0
fi
if $expect_failure; then
    if [ "$rc" = 0 ]; then echo "mpirun: expected the job to fail, it succeeded"; exit 1; fi
    echo "mpirun: the job failed as expected (status $rc) within ${limit}s"
    exit 0
fi
exit "$rc"
