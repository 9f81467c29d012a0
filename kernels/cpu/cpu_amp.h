/* kernels/cpu/cpu_amp.h — the CPU backend's loss-scaling kernels (kernels/cpu/cpu_amp.c). */
#ifndef NANOAMP_KERNELS_CPU_AMP_H
#define NANOAMP_KERNELS_CPU_AMP_H

#include "backend.h"

int na_cpu_amp_unscale(int n, const na_tensor *const *in, na_tensor *const *out,
                       const na_tensor *scale, na_tensor *found_inf);
int na_cpu_amp_update_scale(int kind, const double *hp, na_tensor *scale, na_tensor *counters,
                            int n_found, const na_tensor *const *found_infs);

#endif
