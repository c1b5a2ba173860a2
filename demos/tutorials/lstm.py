"""An LSTM that classifies the sentiment of word sequences, on every core.

``lstm_serial.py`` (the Deep Learning Tutorials' program, BSD license, see
NOTICE.txt) changed as ``logistic_sgd.py`` changes its twin: ``synk.fork``,
``synk.function`` for the four functions, ``synk.distribute``, and ``synk.all_reduce``
of the stored gradients (summed) between ADADELTA's two functions. The minibatches
are time-major (``x`` and ``mask`` of shape (time, sequences)): ``in_axes=[1, 1, 0]``
scatters them along their sequence axis (and the labels along their only one), so
that each process runs the LSTM over every step of its own sequences. The
predictions, one per sequence, are gathered in the sequences' order (``"gather"``,
which synkhronos would also choose for an output per sequence).

ADADELTA's two functions are the serial twin's, which divides their work (unlike the
tutorial) so that a data-parallel step is the serial step: ``f_grad_shared`` stores,
in each process, the gradient of the cost summed over that process's sequences;
``synk.all_reduce(gshared, op="sum")`` adds them up, giving every process the
gradient of the minibatch's summed cost, whatever the split (a process given none of
the sequences adds zeros); ``f_update`` divides it by the minibatch's number of
sequences and updates both running averages from it (the tutorial updates the
average of squared gradients in ``f_grad_shared``, which here sees one process's
gradient only), and every process takes the same step. ``use_noise.set_value`` and
the restoring of the best parameters (``zipp``) set the master's values, as the
tutorial writes them; they reach the workers before their next call.

The program prints the serial program's lines when the minibatches split evenly (16
sequences over 2 or 4 processes, and the synthetic data's last minibatch of 12) in
float64 (floatX's default). Otherwise each step is still the serial step to
rounding: with uneven splits (3 processes, batch sizes not a multiple of the
processes) the costs' tenth decimals may differ after some hundreds of updates, and
in float32 their seventh. With ``--use-dropout`` each process draws its own masks,
and the numbers are not the serial run's.

    python demos/tutorials/lstm.py [--n-parallel N] [--n-epochs N] [--dim-proj N]

The first run compiles the LSTM's gradient for a few minutes (Numba, PyTensor 3's
default); later runs find it in PyTensor's cache.
"""

import argparse
import sys
import time
from collections import OrderedDict

import numpy
import pytensor
import pytensor.tensor as T
from lstm_data import load_data, prepare_data

import synkhronos as synk

SEED = 123  # the tutorial's


def numpy_floatX(data):
    return numpy.asarray(data, dtype=pytensor.config.floatX)


def get_minibatches_idx(n, minibatch_size, shuffle=False):
    """Minibatches of indices into ``n`` items (the last one may be smaller),
    shuffled each epoch for training."""
    idx_list = numpy.arange(n, dtype="int32")
    if shuffle:
        numpy.random.shuffle(idx_list)
    minibatches = [idx_list[start:start + minibatch_size]
                   for start in range(0, n, minibatch_size)]
    return list(enumerate(minibatches))


def zipp(params, tparams):
    """Set the shared variables to the values of ``params`` (the best ones)."""
    for kk, vv in params.items():
        tparams[kk].set_value(vv)


def unzip(zipped):
    """The shared variables' values, copied."""
    return OrderedDict((kk, vv.get_value()) for kk, vv in zipped.items())


def dropout_layer(state_before, use_noise, trng):
    """Each unit kept with probability 0.5 while ``use_noise`` is 1, halved otherwise.
    ``trng`` is a shared numpy generator; returns the output and the update that
    advances the generator."""
    next_rng, keep = T.random.binomial(1, 0.5, size=state_before.shape,
                                       rng=trng).owner.outputs
    proj = T.switch(use_noise, state_before * T.cast(keep, state_before.dtype),
                    state_before * 0.5)
    return proj, [(trng, next_rng)]


def _p(pp, name):
    return f"{pp}_{name}"


def init_params(options):
    """The embedding and the classifier, and the LSTM's weights."""
    params = OrderedDict()
    randn = numpy.random.rand(options["n_words"], options["dim_proj"])
    params["Wemb"] = (0.01 * randn).astype(pytensor.config.floatX)
    params = param_init_lstm(options, params, prefix="lstm")
    params["U"] = 0.01 * numpy.random.randn(options["dim_proj"],
                                            options["ydim"]).astype(pytensor.config.floatX)
    params["b"] = numpy.zeros((options["ydim"],)).astype(pytensor.config.floatX)
    return params


def init_tparams(params):
    return OrderedDict((kk, pytensor.shared(pp, name=kk)) for kk, pp in params.items())


def ortho_weight(ndim):
    W = numpy.random.randn(ndim, ndim)
    u, s, v = numpy.linalg.svd(W)
    return u.astype(pytensor.config.floatX)


def param_init_lstm(options, params, prefix="lstm"):
    """The input, forget, output and cell blocks side by side: W, U orthogonal, b 0."""
    dim = options["dim_proj"]
    params[_p(prefix, "W")] = numpy.concatenate([ortho_weight(dim) for _ in range(4)], axis=1)
    params[_p(prefix, "U")] = numpy.concatenate([ortho_weight(dim) for _ in range(4)], axis=1)
    params[_p(prefix, "b")] = numpy.zeros((4 * dim,)).astype(pytensor.config.floatX)
    return params


def lstm_layer(tparams, state_below, options, prefix="lstm", mask=None):
    """The hidden states at every step, (time, sequences, dim_proj); a masked step
    (past a sequence's end) keeps the previous state."""
    nsteps = state_below.shape[0]
    n_samples = state_below.shape[1]
    dim_proj = options["dim_proj"]
    assert mask is not None

    def _slice(_x, n, dim):
        return _x[:, n * dim:(n + 1) * dim]

    def _step(m_, x_, h_, c_):
        preact = T.dot(h_, tparams[_p(prefix, "U")])
        preact += x_

        i = T.sigmoid(_slice(preact, 0, dim_proj))
        f = T.sigmoid(_slice(preact, 1, dim_proj))
        o = T.sigmoid(_slice(preact, 2, dim_proj))
        c = T.tanh(_slice(preact, 3, dim_proj))

        c = f * c_ + i * c
        c = m_[:, None] * c + (1.0 - m_)[:, None] * c_

        h = o * T.tanh(c)
        h = m_[:, None] * h + (1.0 - m_)[:, None] * h_
        return h, c

    state_below = T.dot(state_below, tparams[_p(prefix, "W")]) + tparams[_p(prefix, "b")]
    rval = pytensor.scan(_step,
                         sequences=[mask, state_below],
                         outputs_info=[T.alloc(numpy_floatX(0.0), n_samples, dim_proj),
                                       T.alloc(numpy_floatX(0.0), n_samples, dim_proj)],
                         name=_p(prefix, "_layers"),
                         n_steps=nsteps,
                         return_updates=False)
    return rval[0]


def adadelta(lr, n_rows, tparams, grads, x, mask, y, cost, noise_updates):
    """ADADELTA (Zeiler, arXiv:1212.5701) in two functions: ``f_grad_shared`` computes
    the cost and stores ``grads`` (of the minibatch's summed cost), ``f_update`` takes
    the step from the stored gradient divided by ``n_rows``. Returns both and the
    stored gradients."""
    zipped_grads = [pytensor.shared(p.get_value() * numpy_floatX(0.0), name=f"{k}_grad")
                    for k, p in tparams.items()]
    running_up2 = [pytensor.shared(p.get_value() * numpy_floatX(0.0), name=f"{k}_rup2")
                   for k, p in tparams.items()]
    running_grads2 = [pytensor.shared(p.get_value() * numpy_floatX(0.0), name=f"{k}_rgrad2")
                      for k, p in tparams.items()]

    zgup = [(zg, g) for zg, g in zip(zipped_grads, grads, strict=True)]
    f_grad_shared = synk.function([x, mask, y], cost, updates=zgup + noise_updates,
                                  name="adadelta_f_grad_shared", in_axes=[1, 1, 0])

    mean_grads = [zg / n_rows for zg in zipped_grads]
    rg2_new = [0.95 * rg2 + 0.05 * (g ** 2)
               for rg2, g in zip(running_grads2, mean_grads, strict=True)]
    updir = [-T.sqrt(ru2 + 1e-6) / T.sqrt(rg2 + 1e-6) * g
             for g, ru2, rg2 in zip(mean_grads, running_up2, rg2_new, strict=True)]
    rg2up = list(zip(running_grads2, rg2_new, strict=True))
    ru2up = [(ru2, 0.95 * ru2 + 0.05 * (ud ** 2))
             for ru2, ud in zip(running_up2, updir, strict=True)]
    param_up = [(p, p + ud) for p, ud in zip(tparams.values(), updir, strict=True)]
    # Zeroed after each step: a process given none of a minibatch's sequences does not
    # run f_grad_shared, and must then add nothing, not its previous gradient.
    zero = [(zg, T.zeros_like(zg)) for zg in zipped_grads]
    f_update = synk.function([], [], bcast_inputs=[lr, n_rows],
                             updates=rg2up + ru2up + param_up + zero,
                             on_unused_input="ignore", name="adadelta_f_update")
    return f_grad_shared, f_update, zipped_grads


def build_model(tparams, options):
    """The graph from ``x``, ``mask`` to the class probabilities, the prediction
    functions and the cost (the mean over the minibatch's sequences)."""
    trng = pytensor.shared(numpy.random.default_rng(SEED), name="trng")
    use_noise = pytensor.shared(numpy_floatX(0.0))  # dropout on (1) or off (0)

    x = T.matrix("x", dtype="int64")
    mask = T.matrix("mask", dtype=pytensor.config.floatX)
    y = T.vector("y", dtype="int64")

    n_timesteps = x.shape[0]
    n_samples = x.shape[1]

    emb = tparams["Wemb"][x.flatten()].reshape([n_timesteps, n_samples,
                                                options["dim_proj"]])
    proj = lstm_layer(tparams, emb, options, prefix="lstm", mask=mask)
    proj = (proj * mask[:, :, None]).sum(axis=0)  # mean pooling over each sequence
    proj = proj / mask.sum(axis=0)[:, None]
    noise_updates = []
    if options["use_dropout"]:
        proj, noise_updates = dropout_layer(proj, use_noise, trng)

    pred = T.special.softmax(T.dot(proj, tparams["U"]) + tparams["b"], axis=-1)

    f_pred_prob = synk.function([x, mask], (pred, "gather"), name="f_pred_prob",
                                in_axes=[1, 1])
    f_pred = synk.function([x, mask], (pred.argmax(axis=1), "gather"), name="f_pred",
                           in_axes=[1, 1])

    cost = -T.log(pred[T.arange(n_samples), y] + 1e-8).mean()
    return use_noise, x, mask, y, f_pred_prob, f_pred, cost, noise_updates


def pred_probs(f_pred_prob, prepare_data, data, iterator):
    """The class probabilities of every sequence of ``data``."""
    probs = numpy.zeros((len(data[0]), 2), dtype=pytensor.config.floatX)
    for _, valid_index in iterator:
        x, mask, _ = prepare_data([data[0][t] for t in valid_index],
                                  numpy.array(data[1])[valid_index], maxlen=None)
        probs[valid_index, :] = f_pred_prob(x, mask)
    return probs


def pred_error(f_pred, prepare_data, data, iterator):
    """The fraction of ``data`` misclassified."""
    valid_err = 0
    for _, valid_index in iterator:
        x, mask, _ = prepare_data([data[0][t] for t in valid_index],
                                  numpy.array(data[1])[valid_index], maxlen=None)
        preds = f_pred(x, mask)
        targets = numpy.array(data[1])[valid_index]
        valid_err += (preds == targets).sum()
    return 1.0 - numpy_floatX(valid_err) / len(data[0])


def train_lstm(dim_proj=128, patience=10, max_epochs=5000, dispFreq=10, lrate=0.0001,
               n_words=1000, validFreq=-1, maxlen=100, batch_size=16, valid_batch_size=64,
               dataset=None, use_dropout=False, seed=SEED):
    """Train with early stopping on the validation set, as the tutorial does.

    ``patience``: validations without progress before stopping; ``validFreq``,
    ``dispFreq``: updates between validations, between cost lines (-1: one epoch);
    ``maxlen``: longer training sequences are dropped; ``lrate`` is unused (ADADELTA).
    """
    numpy.random.seed(seed)
    model_options = dict(dim_proj=dim_proj, n_words=n_words, use_dropout=use_dropout)

    print("Loading data")
    train, valid, test = load_data(dataset, n_words=n_words, valid_portion=0.05,
                                   maxlen=maxlen)
    model_options["ydim"] = int(numpy.max(train[1])) + 1

    print("Building model")
    params = init_params(model_options)
    tparams = init_tparams(params)
    (use_noise, x, mask, y, f_pred_prob, f_pred, cost,
     noise_updates) = build_model(tparams, model_options)

    # The gradient of the summed cost: f_update divides it by the sequences' number.
    grads = T.grad(cost * x.shape[1], wrt=list(tparams.values()))
    lr = T.scalar(name="lr")
    n_rows = T.scalar(name="n_rows")
    f_grad_shared, f_update, gshared = adadelta(lr, n_rows, tparams, grads, x, mask, y,
                                                cost, noise_updates)
    synk.distribute()

    print("Optimization")
    kf_valid = get_minibatches_idx(len(valid[0]), valid_batch_size)
    kf_test = get_minibatches_idx(len(test[0]), valid_batch_size)
    print(f"{len(train[0])} train examples")
    print(f"{len(valid[0])} valid examples")
    print(f"{len(test[0])} test examples")

    history_errs = []
    best_p = None
    bad_counter = 0
    if validFreq == -1:
        validFreq = max(1, len(train[0]) // batch_size)
    if dispFreq == -1:
        dispFreq = max(1, len(train[0]) // batch_size)

    uidx = 0  # the number of updates done
    estop = False  # early stop
    start_time = time.perf_counter()
    for eidx in range(max_epochs):
        n_samples = 0
        kf = get_minibatches_idx(len(train[0]), batch_size, shuffle=True)
        for _, train_index in kf:
            uidx += 1
            use_noise.set_value(numpy_floatX(1.0))

            y = [train[1][t] for t in train_index]
            x = [train[0][t] for t in train_index]
            x, mask, y = prepare_data(x, y)  # (longest sequence, n_samples)
            n_samples += x.shape[1]

            cost = f_grad_shared(x, mask, y)
            synk.all_reduce(gshared, op="sum")
            f_update(lrate, x.shape[1])

            if numpy.isnan(cost) or numpy.isinf(cost):
                print(f"bad cost detected: {cost}")
                return 1.0, 1.0, 1.0

            if numpy.mod(uidx, dispFreq) == 0:
                print(f"Epoch {eidx} Update {uidx} Cost {float(cost):.10f}")

            if numpy.mod(uidx, validFreq) == 0:
                use_noise.set_value(numpy_floatX(0.0))
                train_err = pred_error(f_pred, prepare_data, train, kf)
                valid_err = pred_error(f_pred, prepare_data, valid, kf_valid)
                test_err = pred_error(f_pred, prepare_data, test, kf_test)
                history_errs.append([valid_err, test_err])

                if best_p is None or valid_err <= numpy.array(history_errs)[:, 0].min():
                    best_p = unzip(tparams)
                    bad_counter = 0

                print(f"Train {train_err:.6f} Valid {valid_err:.6f} Test {test_err:.6f}")

                if (len(history_errs) > patience
                        and valid_err >= numpy.array(history_errs)[:-patience, 0].min()):
                    bad_counter += 1
                    if bad_counter > patience:
                        print("Early Stop!")
                        estop = True
                        break

        print(f"Seen {n_samples} samples")
        if estop:
            break

    end_time = time.perf_counter()
    if best_p is not None:
        zipp(best_p, tparams)
    else:
        best_p = unzip(tparams)

    use_noise.set_value(numpy_floatX(0.0))
    kf_train_sorted = get_minibatches_idx(len(train[0]), batch_size)
    train_err = pred_error(f_pred, prepare_data, train, kf_train_sorted)
    valid_err = pred_error(f_pred, prepare_data, valid, kf_valid)
    test_err = pred_error(f_pred, prepare_data, test, kf_test)
    print(f"Train {train_err:.6f} Valid {valid_err:.6f} Test {test_err:.6f}")
    probs = pred_probs(f_pred_prob, prepare_data, test, kf_test)
    right = probs[numpy.arange(len(test[1])), test[1]]
    print(f"Test probability of the right class: mean {right.mean():.10f}")
    print(f"The code ran for {eidx + 1} epochs, with "
          f"{(end_time - start_time) / (eidx + 1):f} sec/epoch", file=sys.stderr)
    return train_err, valid_err, test_err


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--n-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--valid-batch-size", type=int, default=64)
    parser.add_argument("--dim-proj", type=int, default=128)
    parser.add_argument("--n-words", type=int, default=1000)
    parser.add_argument("--maxlen", type=int, default=100)
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--valid-freq", type=int, default=-1,
                        help="updates between validations (-1: one epoch)")
    parser.add_argument("--disp-freq", type=int, default=10,
                        help="updates between cost lines (-1: one epoch)")
    parser.add_argument("--use-dropout", action="store_true")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--dataset", default=None,
                        help="the tutorial's imdb.pkl (default: synthetic, lstm_data.py)")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    synk.fork(args.n_parallel)
    train_lstm(dim_proj=args.dim_proj, patience=args.patience, max_epochs=args.n_epochs,
               dispFreq=args.disp_freq, n_words=args.n_words, validFreq=args.valid_freq,
               maxlen=args.maxlen, batch_size=args.batch_size,
               valid_batch_size=args.valid_batch_size, dataset=args.dataset,
               use_dropout=args.use_dropout, seed=args.seed)
