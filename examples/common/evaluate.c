/* Evaluation for the trainers (see trainer.h, trainer_internal.h): accuracy and mean
 * cross-entropy over a test set in batches, sharded over the ranks. */
#include <stdlib.h>

#include "trainer_internal.h"

/* trainer_evaluate's batch when no training batch is at hand (the trainers' default --batch);
 * trainer_run evaluates in its training batches, so evaluation needs no larger activations
 * than training (a batch of 1000 doubled the CNN's peak RSS). */
#define EVAL_BATCH_DEFAULT 128

/* With dist (several ranks), each rank evaluates its shard of ds, every sample once over all
 * ranks (no padding), and the counts and loss sums are summed across ranks: every rank
 * returns the numbers of the whole set. channels_last: the images go in channels-last, as
 * the training batches do under --channels-last (the same values, the network's layout). */
int trainer_evaluate_ranks(na_module *net, const na_dataset *ds, const float *mean,
                           const float *std, na_device dev, na_dtype input_dtype,
                           bool channels_last, int64_t batch, na_dist *dist, double *accuracy,
                           double *loss) {
    na_batcher *b = na_batcher_new(ds, &(na_batcher_cfg){.batch_size = batch, .mean = mean,
                                                         .std = std,
                                                         .world_size = na_dist_world_size(dist),
                                                         .rank = na_dist_rank(dist),
                                                         .shard_no_pad = true});
    float *x = b ? malloc(na_batcher_batch_bytes(b)) : NULL;
    int32_t *y = malloc(sizeof(int32_t) * (size_t)batch);
    int32_t *pred = malloc(sizeof(int32_t) * (size_t)batch);
    int rc = b ? NA_OK : na_last_status();
    if (!rc && (!x || !y || !pred)) rc = na_set_error(NA_ENOMEM, "evaluation: out of host memory");
    int64_t n, correct = 0, seen = 0;
    double loss_sum = 0;
    na_module_eval(net);
    na_no_grad_begin();
    if (!rc) rc = na_batcher_start_epoch(b, 0);
    while (!rc && na_batcher_next(b, x, y, &n)) {
        int64_t shape[4] = {n, ds->channels, ds->height, ds->width};
        na_tensor *xt = na_from_host(NA_DTYPE_F32, dev, 4, shape, x);
        na_tensor *yt = na_from_host(NA_DTYPE_I32, dev, NA_SHAPE(n), y);
        if (xt && channels_last) xt = na_to_channels_last(xt);
        if (xt) xt = na_cast(xt, input_dtype);
        na_tensor *logits = xt ? na_module_forward(net, xt) : NULL;
        na_tensor *am = logits ? na_argmax(logits, 1, false) : NULL;
        na_tensor *ce = am && yt ? na_cross_entropy(logits, yt, NULL) : NULL;
        if (!ce || na_copy_to_host(am, pred) != NA_OK) rc = na_last_status();
        for (int64_t i = 0; !rc && i < n; i++) correct += pred[i] == y[i];
        if (!rc) loss_sum += na_item(ce) * (double)n, seen += n;
        na_step_end();
    }
    na_no_grad_end();
    na_module_train(net, true);
    free(x), free(y), free(pred);
    na_batcher_free(b);
    if (dist) { /* every rank gets here (no collective per batch: shards may differ by one) */
        int64_t counts[3] = {rc != 0, correct, seen};
        int crc = na_dist_all_reduce_i64(dist, counts, 3, NA_DIST_SUM);
        if (!crc) crc = na_dist_all_reduce_f64(dist, &loss_sum, 1, NA_DIST_SUM);
        if (crc) rc = crc;
        else if (!rc && counts[0]) rc = na_set_error(NA_ESTATE, "evaluation failed on another rank");
        correct = counts[1], seen = counts[2];
    }
    if (!rc && !seen) rc = na_set_error(NA_EINVAL, "evaluation: the test set is empty");
    if (rc) return rc;
    *accuracy = (double)correct / (double)seen;
    *loss = loss_sum / (double)seen;
    return NA_OK;
}

int trainer_evaluate(na_module *net, const na_dataset *ds, const float *mean, const float *std,
                     na_device dev, na_dtype input_dtype, double *accuracy, double *loss) {
    return trainer_evaluate_ranks(net, ds, mean, std, dev, input_dtype, false, EVAL_BATCH_DEFAULT,
                                  NULL, accuracy, loss);
}
