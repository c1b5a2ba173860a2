"""Logistic regression trained by minibatch SGD, on every core.

``logistic_sgd_serial.py`` (the Deep Learning Tutorials' program, BSD license, see
NOTICE.txt) changed in eight lines: ``import synkhronos``, ``synk.fork``,
``synk.function`` for the three functions, ``synk.distribute``, ``synk.all_reduce``
of the parameters after each step, and the ``--n-parallel`` flag. Each process runs
its block of each minibatch's rows (300 of the 600 at two processes); the processes'
steps average to the serial step, so the program prints the serial program's numbers
whenever the minibatch splits evenly.

    python demos/tutorials/logistic_sgd.py [--n-parallel N] [--n-epochs N]
"""

import argparse
import sys
import time

import numpy
import pytensor
import pytensor.tensor as T
from tutorial_data import load_data

import synkhronos as synk


class LogisticRegression:
    """Multi-class logistic regression: ``P(Y=i | x) = softmax_i(x W + b)``."""

    def __init__(self, input, n_in, n_out):
        self.W = pytensor.shared(numpy.zeros((n_in, n_out), dtype=pytensor.config.floatX),
                                 name="W", borrow=True)
        self.b = pytensor.shared(numpy.zeros((n_out,), dtype=pytensor.config.floatX),
                                 name="b", borrow=True)
        # One distribution per row: softmax over the classes (axis=-1). Theano's
        # T.nnet.softmax was per row; PyTensor's default axis=None is over everything.
        self.p_y_given_x = T.special.softmax(T.dot(input, self.W) + self.b, axis=-1)
        self.y_pred = T.argmax(self.p_y_given_x, axis=1)
        self.params = [self.W, self.b]
        self.input = input

    def negative_log_likelihood(self, y):
        """Mean over the minibatch of ``-log P(Y = y_i | x_i)``."""
        return -T.mean(T.log(self.p_y_given_x)[T.arange(y.shape[0]), y])

    def errors(self, y):
        """The fraction of the minibatch that is misclassified."""
        if y.ndim != self.y_pred.ndim:
            raise TypeError("y should have the same shape as self.y_pred",
                            ("y", y.type, "y_pred", self.y_pred.type))
        if y.dtype.startswith("int"):
            return T.mean(T.neq(self.y_pred, y))
        raise NotImplementedError()


def sgd_optimization(learning_rate=0.13, n_epochs=1000, dataset=None, batch_size=600):
    """Train with early stopping on the validation set, as the tutorial does."""
    datasets, n_in = load_data(dataset)
    train_set_x, train_set_y = datasets[0]
    valid_set_x, valid_set_y = datasets[1]
    test_set_x, test_set_y = datasets[2]

    n_train_batches = train_set_x.get_value(borrow=True).shape[0] // batch_size
    n_valid_batches = valid_set_x.get_value(borrow=True).shape[0] // batch_size
    n_test_batches = test_set_x.get_value(borrow=True).shape[0] // batch_size

    print("... building the model")
    index = T.lscalar()  # index to a minibatch
    x = T.matrix("x")  # rasterized images
    y = T.ivector("y")  # int labels

    classifier = LogisticRegression(input=x, n_in=n_in, n_out=10)
    cost = classifier.negative_log_likelihood(y)

    test_model = synk.function(
        inputs=[index],
        outputs=classifier.errors(y),
        givens={
            x: test_set_x[index * batch_size: (index + 1) * batch_size],
            y: test_set_y[index * batch_size: (index + 1) * batch_size]})

    validate_model = synk.function(
        inputs=[index],
        outputs=classifier.errors(y),
        givens={
            x: valid_set_x[index * batch_size: (index + 1) * batch_size],
            y: valid_set_y[index * batch_size: (index + 1) * batch_size]})

    g_W = T.grad(cost=cost, wrt=classifier.W)
    g_b = T.grad(cost=cost, wrt=classifier.b)
    updates = [(classifier.W, classifier.W - learning_rate * g_W),
               (classifier.b, classifier.b - learning_rate * g_b)]

    train_model = synk.function(
        inputs=[index],
        outputs=cost,
        updates=updates,
        givens={
            x: train_set_x[index * batch_size: (index + 1) * batch_size],
            y: train_set_y[index * batch_size: (index + 1) * batch_size]})

    synk.distribute()
    print("... training the model")
    patience = 5000  # look at this many minibatches regardless
    patience_increase = 2  # wait this much longer when a new best is found
    improvement_threshold = 0.995  # a relative improvement this large is significant
    validation_frequency = min(n_train_batches, patience // 2)

    best_validation_loss = numpy.inf
    test_score = 0.0
    start_time = time.perf_counter()
    done_looping = False
    epoch = 0
    while (epoch < n_epochs) and (not done_looping):
        epoch = epoch + 1
        for minibatch_index in range(n_train_batches):
            minibatch_avg_cost = train_model(minibatch_index)
            synk.all_reduce(classifier.params)
            iter = (epoch - 1) * n_train_batches + minibatch_index
            if (iter + 1) % validation_frequency == 0:
                validation_losses = [validate_model(i) for i in range(n_valid_batches)]
                this_validation_loss = numpy.mean(validation_losses)
                print(f"epoch {epoch}, minibatch {minibatch_index + 1}/{n_train_batches}, "
                      f"validation error {this_validation_loss * 100.0:f} %, "
                      f"cost {float(minibatch_avg_cost):.12f}")
                if this_validation_loss < best_validation_loss:
                    if this_validation_loss < best_validation_loss * improvement_threshold:
                        patience = max(patience, iter * patience_increase)
                    best_validation_loss = this_validation_loss
                    test_losses = [test_model(i) for i in range(n_test_batches)]
                    test_score = numpy.mean(test_losses)
                    print(f"     epoch {epoch}, minibatch {minibatch_index + 1}/"
                          f"{n_train_batches}, test error of best model {test_score * 100.0:f} %")
            if patience <= iter:
                done_looping = True
                break

    end_time = time.perf_counter()
    print(f"Optimization complete with best validation score of "
          f"{best_validation_loss * 100.0:f} %, with test performance {test_score * 100.0:f} %")
    print(f"The code ran for {epoch} epochs, with {epoch / (end_time - start_time):f} "
          "epochs/sec", file=sys.stderr)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-parallel", type=int, default=None)
    parser.add_argument("--n-epochs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=600)
    parser.add_argument("--dataset", default=None,
                        help="mnist.pkl.gz or mnist.npz (default: scikit-learn's digits)")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    synk.fork(args.n_parallel)
    sgd_optimization(n_epochs=args.n_epochs, dataset=args.dataset,
                     batch_size=args.batch_size)
