/* The registry: which backend serves a device. */
#include "backend.h"

#include "na_config.h"
#include "nanoamp/error.h"

const na_backend *na_backend_get(na_device dev) {
    switch (dev) {
    case NA_DEVICE_CPU: return &na_cpu_backend;
    case NA_DEVICE_CUDA:
#if NA_HAVE_CUDA
    {
        static const na_backend *cuda;
        static int tried;
        static char why[512];
        if (!tried) {
            tried = 1;
            cuda = na_cuda_backend_init();
            if (!cuda) {
                const char *msg = na_last_error();
                int i = 0;
                for (; msg[i] && i < (int)sizeof why - 1; i++) why[i] = msg[i];
                why[i] = '\0';
            }
        }
        if (!cuda) na_set_error(NA_EDEVICE, "no CUDA device available: %s", why);
        return cuda;
    }
#else
        na_set_error(NA_EDEVICE,
                     "this build of nanoamp has no CUDA backend (configure with -Dcuda=enabled "
                     "on a machine with the CUDA toolkit)");
        return NULL;
#endif
    default: na_set_error(NA_EINVAL, "unknown device %d", (int)dev); return NULL;
    }
}
