# Sourced by tests/mpirun.sh and tests/trainer_dist.sh: the environment Open MPI's mpirun needs
# on CI and on small machines, and what a sanitized build (build-asan) needs under it.
# CI runs as root, which Open MPI refuses unless told; a 2-core machine needs oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# containers often forbid the cross-memory attach that shared-memory transfers try first
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# ASan/LSan (no effect on other builds): Open MPI keeps allocations until exit; its leaks are
# suppressed by library (tests/lsan-openmpi.supp), which needs whole stacks and its components
# still loaded when LSan reports. The caller's own LSAN_/ASAN_OPTIONS come after, and win.
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lsan-openmpi.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export ASAN_OPTIONS="fast_unwind_on_malloc=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export OMPI_MCA_mca_base_component_disable_dlclose=1
