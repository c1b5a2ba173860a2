"""A multilayer perceptron trained by minibatch SGD: the serial program.

A port of ``mlp.py`` from the LISA lab's Deep Learning Tutorials (BSD license, see
NOTICE.txt) from Theano to PyTensor: one tanh hidden layer under the logistic
regression of ``logistic_sgd_serial.py``, L1 and L2 penalties, the tutorial's
minibatch of 20 rows. Its twin ``mlp.py`` runs on every core; the two print the same
lines.

    python demos/tutorials/mlp_serial.py [--n-epochs N] [--n-hidden N]
"""

import argparse
import sys
import time

import numpy
import pytensor
import pytensor.tensor as T
from logistic_sgd_serial import LogisticRegression
from tutorial_data import load_data


class HiddenLayer:
    """A fully connected layer: ``activation(input W + b)``, W drawn uniformly in
    +-sqrt(6 / (n_in + n_out)) (four times that for the sigmoid)."""

    def __init__(self, rng, input, n_in, n_out, W=None, b=None, activation=T.tanh):
        self.input = input
        if W is None:
            bound = numpy.sqrt(6.0 / (n_in + n_out))
            W_values = numpy.asarray(rng.uniform(low=-bound, high=bound, size=(n_in, n_out)),
                                     dtype=pytensor.config.floatX)
            if activation == T.sigmoid:
                W_values *= 4
            W = pytensor.shared(value=W_values, name="W", borrow=True)
        if b is None:
            b_values = numpy.zeros((n_out,), dtype=pytensor.config.floatX)
            b = pytensor.shared(value=b_values, name="b", borrow=True)
        self.W = W
        self.b = b
        lin_output = T.dot(input, self.W) + self.b
        self.output = lin_output if activation is None else activation(lin_output)
        self.params = [self.W, self.b]


class MLP:
    """One hidden layer of tanh units feeding a softmax (logistic regression) layer."""

    def __init__(self, rng, input, n_in, n_hidden, n_out):
        self.hiddenLayer = HiddenLayer(rng=rng, input=input, n_in=n_in, n_out=n_hidden,
                                       activation=T.tanh)
        self.logRegressionLayer = LogisticRegression(input=self.hiddenLayer.output,
                                                     n_in=n_hidden, n_out=n_out)
        self.L1 = abs(self.hiddenLayer.W).sum() + abs(self.logRegressionLayer.W).sum()
        self.L2_sqr = (self.hiddenLayer.W ** 2).sum() + (self.logRegressionLayer.W ** 2).sum()
        self.negative_log_likelihood = self.logRegressionLayer.negative_log_likelihood
        self.errors = self.logRegressionLayer.errors
        self.params = self.hiddenLayer.params + self.logRegressionLayer.params
        self.input = input


def test_mlp(learning_rate=0.01, L1_reg=0.00, L2_reg=0.0001, n_epochs=1000, dataset=None,
             batch_size=20, n_hidden=500):
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
    rng = numpy.random.RandomState(1234)

    classifier = MLP(rng=rng, input=x, n_in=n_in, n_hidden=n_hidden, n_out=10)
    cost = (classifier.negative_log_likelihood(y) + L1_reg * classifier.L1
            + L2_reg * classifier.L2_sqr)

    test_model = pytensor.function(
        inputs=[index],
        outputs=classifier.errors(y),
        givens={
            x: test_set_x[index * batch_size:(index + 1) * batch_size],
            y: test_set_y[index * batch_size:(index + 1) * batch_size]})

    validate_model = pytensor.function(
        inputs=[index],
        outputs=classifier.errors(y),
        givens={
            x: valid_set_x[index * batch_size:(index + 1) * batch_size],
            y: valid_set_y[index * batch_size:(index + 1) * batch_size]})

    gparams = [T.grad(cost, param) for param in classifier.params]
    updates = [(param, param - learning_rate * gparam)
               for param, gparam in zip(classifier.params, gparams, strict=True)]

    train_model = pytensor.function(
        inputs=[index],
        outputs=cost,
        updates=updates,
        givens={
            x: train_set_x[index * batch_size: (index + 1) * batch_size],
            y: train_set_y[index * batch_size: (index + 1) * batch_size]})

    print("... training")
    patience = 10000  # look at this many minibatches regardless
    patience_increase = 2  # wait this much longer when a new best is found
    improvement_threshold = 0.995  # a relative improvement this large is significant
    validation_frequency = min(n_train_batches, patience // 2)

    best_validation_loss = numpy.inf
    best_iter = 0
    test_score = 0.0
    start_time = time.perf_counter()
    epoch = 0
    done_looping = False
    while (epoch < n_epochs) and (not done_looping):
        epoch = epoch + 1
        for minibatch_index in range(n_train_batches):
            minibatch_avg_cost = train_model(minibatch_index)
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
                    best_iter = iter
                    test_losses = [test_model(i) for i in range(n_test_batches)]
                    test_score = numpy.mean(test_losses)
                    print(f"     epoch {epoch}, minibatch {minibatch_index + 1}/"
                          f"{n_train_batches}, test error of best model {test_score * 100.0:f} %")
            if patience <= iter:
                done_looping = True
                break

    end_time = time.perf_counter()
    print(f"Optimization complete. Best validation score of {best_validation_loss * 100.0:f} "
          f"% obtained at iteration {best_iter + 1}, with test performance "
          f"{test_score * 100.0:f} %")
    print(f"The code ran for {(end_time - start_time) / 60.0:.2f}m", file=sys.stderr)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-epochs", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--n-hidden", type=int, default=500)
    parser.add_argument("--dataset", default=None,
                        help="mnist.pkl.gz or mnist.npz (default: scikit-learn's digits)")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    test_mlp(n_epochs=args.n_epochs, dataset=args.dataset, batch_size=args.batch_size,
             n_hidden=args.n_hidden)
