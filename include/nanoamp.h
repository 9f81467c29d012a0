/* nanoamp.h — the umbrella header: everything a user of nanoamp needs.
 *
 *   error.h     status codes and na_last_error()
 *   dtype.h     f64, f32, f16, bf16, i32, u8; devices
 *   view.h      the plain view of memory that backend kernels take (every tensor embeds one)
 *   tensor.h    tensors, the step arena, the generator
 *   state.h     tensor lists: parameter lists and the state protocol
 *   ops.h       the op table and the differentiable ops
 *   autocast.h  autocast regions, rules and the trace (included by amp.h)
 *   autograd.h  backward, no-grad, gradcheck
 *   profile.h   per-op and per-layer time of a step
 *   amp.h       loss scaling, master weights, model conversion, monitoring
 *   fp8.h       FP8 per-tensor scaling recipes (delayed, current), amax histories
 *   nn.h        modules and layers
 *   optim.h     SGD, Adam, AdamW, schedules, clipping
 *   data.h      MNIST/CIFAR readers and batching
 *   io.h        checkpoints (safetensors)
 *   dist.h      data parallelism: MPI/NCCL communicator, DDP wrapper, SyncBatchNorm
 *   cuda.h      the CUDA device
 *   threads.h   the CPU thread pool: na_set_num_threads / na_get_num_threads
 */
#ifndef NANOAMP_H
#define NANOAMP_H
#include "nanoamp/error.h"
#include "nanoamp/dtype.h"
#include "nanoamp/tensor.h"
#include "nanoamp/state.h"
#include "nanoamp/ops.h"
#include "nanoamp/autograd.h"
#include "nanoamp/profile.h"
#include "nanoamp/amp.h"
#include "nanoamp/fp8.h"
#include "nanoamp/nn.h"
#include "nanoamp/optim.h"
#include "nanoamp/data.h"
#include "nanoamp/io.h"
#include "nanoamp/dist.h"
#include "nanoamp/cuda.h"
#include "nanoamp/threads.h"
#endif
