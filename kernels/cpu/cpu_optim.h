/* kernels/cpu/cpu_optim.h — the CPU backend's optimizer kernels (kernels/cpu/cpu_optim.c). */
#ifndef NANOAMP_KERNELS_CPU_OPTIM_H
#define NANOAMP_KERNELS_CPU_OPTIM_H

#include "backend.h"

int na_cpu_sgd_step(const na_optim_tensors *t, const na_optim_hparams *h);
int na_cpu_adam_step(const na_optim_tensors *t, const na_optim_hparams *h);
int na_cpu_l2norm(int n, const na_tensor *const *xs, na_tensor *norm, na_tensor *coef,
                  double max_norm);

#endif
