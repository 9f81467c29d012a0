/* Helpers shared by the optimizer files (internal). */
#ifndef NANOAMP_SRC_OPTIM_INTERNAL_H
#define NANOAMP_SRC_OPTIM_INTERNAL_H

#include "kernels/backend.h"
#include "nanoamp/error.h"

/* NA_OK when backend `be` has kernel `field`, else NA_ENOTSUP with "<field> is not
 * implemented on <backend>": a backend may lack the optimizer kernels (they are optional). */
#define NA_OPTIM_NEED_KERNEL(be, field)                                                  \
    ((be)->field ? NA_OK                                                                 \
                 : na_set_error(NA_ENOTSUP, "%s is not implemented on %s", #field, (be)->name))
#endif
