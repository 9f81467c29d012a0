/* Helpers shared by the optimizer files (internal). */
#ifndef NANOAMP_SRC_OPTIM_INTERNAL_H
#define NANOAMP_SRC_OPTIM_INTERNAL_H

#include "kernels/backend.h"
#include "nanoamp/error.h"
#endif
