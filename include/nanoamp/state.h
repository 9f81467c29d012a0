/* nanoamp/state.h — tensor lists: the parameters an optimizer takes, and the state protocol.
 *
 * Parameter lists. An optimizer takes a plain list of tensors (na_tensor_list), not a module:
 *
 *     na_optim *opt = na_sgd_new(na_module_parameters(net), &cfg);   // a model's parameters
 *     na_optim *opt2 = na_adam_new(NA_TENSORS(w, b), &acfg);         // tensors of one's own
 *
 * A list made by a function (na_module_parameters, na_optim_parameters) is a step list: it
 * lives in the step arena until na_step_end(), like a step tensor, so it needs no freeing;
 * whoever keeps the tensors copies the pointers. A failed maker returns a list with n < 0
 * (error kept), and every function taking a list fails on it keeping that error, so calls
 * chain without checks.
 *
 * The state protocol. Every stateful object (module, optimizer, GradScaler of any kind, fp16
 * optimizer, training monitor) lists its whole state the same way:
 *
 *     int na_<object>_state(<object> *x, const char *prefix, na_named_tensors *out);
 *
 * appends one item (prefix + name, tensor) per state tensor to out. The tensors are the
 * object's live, persistent state: a checkpoint reads them when saving and writes into them
 * when loading (nanoamp/io.h: na_checkpoint_add_list, na_checkpoint_copy_list), so one list
 * serves both ways. Load into an object made the same way as the one saved (same parameters,
 * config and device); each object checks loaded values at its next use.
 *
 *     na_named_tensors st = {0};                      // start empty; the calls append
 *     int rc = na_module_state(net, "", &st);
 *     if (!rc) rc = na_optim_state(opt, "optim.", &st);
 *     if (!rc) rc = na_grad_scaler_state(gs, "scaler.", &st);
 *     if (!rc) rc = na_checkpoint_save_list("ck.safetensors", &st);  // or _load_list
 *     na_named_tensors_free(&st);                     // the list, not the tensors
 */
#ifndef NANOAMP_STATE_H
#define NANOAMP_STATE_H

#include <stdint.h>

#include "nanoamp/error.h"
#include "nanoamp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- plain lists ---------------------------------------------------------------------- */
typedef struct {
    int64_t n; /* < 0: the maker failed (error kept) */
    na_tensor **items;
} na_tensor_list;

/* A list of the given tensors (a compound literal: valid in the enclosing block). */
#define NA_TENSORS(...)                                                                   \
    ((na_tensor_list){(int64_t)(sizeof((na_tensor *[]){__VA_ARGS__}) / sizeof(na_tensor *)), \
                      (na_tensor *[]){__VA_ARGS__}})
#define NA_NO_TENSORS ((na_tensor_list){0, NULL})

/* NA_OK for a valid list (n >= 0, items for n > 0), else the maker's error (n < 0) or
 * NA_EINVAL naming fn. */
int na_tensor_list_check(const char *fn, na_tensor_list l);

/* ---- named lists ---------------------------------------------------------------------- */
typedef struct {
    char *name;        /* owned by the list: "features.0.weight", "optim.state.3.exp_avg" */
    na_tensor *tensor; /* not owned */
    void *owner;       /* the object holding the tensor directly (a module's tensors: its
                          na_module), or NULL */
} na_named_tensor;
typedef struct {
    int64_t n, cap; /* start from {0} */
    na_named_tensor *items;
} na_named_tensors;

/* Appends (name, t), the name formatted printf-style (copied). NA_ENOMEM on failure (the
 * list is unchanged). */
int na_named_tensors_add(na_named_tensors *l, na_tensor *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void na_named_tensors_free(na_named_tensors *l); /* the list (empty again), not the tensors */
/* Drops the items from index n on: how a state function that fails leaves out as it was. */
void na_named_tensors_truncate(na_named_tensors *l, int64_t n);
na_tensor *na_named_tensors_find(const na_named_tensors *l, const char *name);

/* ---- in-place conversion of state --------------------------------------------------- */
/* Gives the persistent tensor t storage of dtype dt on dev holding its values (converted);
 * the struct stays, so every pointer to it stays valid. Not its gradient. */
int na_tensor_convert_(na_tensor *t, na_dtype dt, na_device dev);

#ifdef __cplusplus
}
#endif
#endif
