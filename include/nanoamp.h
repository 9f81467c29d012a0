/* nanoamp.h — the umbrella header: everything a user of nanoamp needs. */
#ifndef NANOAMP_H
#define NANOAMP_H
#include "nanoamp/error.h"
#include "nanoamp/dtype.h"
#endif
