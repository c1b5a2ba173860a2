"""LeNet5 trained by minibatch SGD: the serial program.

Two layers of convolution and max-pooling, then a tanh layer and a logistic
regression. A port of ``convolutional_mlp.py`` from the LISA lab's Deep Learning
Tutorials (BSD license, see NOTICE.txt) from Theano to PyTensor: ``theano`` ->
``pytensor``, Python 3, and the one import PyTensor 3 cannot serve, Theano's
convolution and pooling, taken from ``synkhronos.extensions`` (the same arguments and
results). The tutorial's layers want 28x28 images: MNIST with ``--dataset``, or by
default scikit-learn's digits enlarged to that size. Its twin
``convolutional_mlp.py`` runs on every core; the two print the same lines.

    python demos/tutorials/convolutional_mlp_serial.py [--n-epochs N] [--nkerns 20,50]

PyTensor 3 compiles with Numba by default; its C backend runs these convolutions
1.6 to 2.7 times faster (docs/migrating.rst) and compiles the gradient in less time:
``PYTENSOR_FLAGS=linker=cvm python demos/tutorials/convolutional_mlp_serial.py``.
"""

import argparse
import sys
import time

import numpy
import pytensor
import pytensor.tensor as T
from logistic_sgd_serial import LogisticRegression
from mlp_serial import HiddenLayer
from tutorial_data import load_data

from synkhronos.extensions import conv2d, pool_2d


class LeNetConvPoolLayer:
    """A convolution, a max-pooling of its feature maps, a bias per map and tanh."""

    def __init__(self, rng, input, filter_shape, image_shape, poolsize=(2, 2)):
        assert image_shape[1] == filter_shape[1]
        self.input = input
        # Each hidden unit sees channels * height * width inputs, and sends its gradient
        # to filters * height * width units, divided by the pooling.
        fan_in = numpy.prod(filter_shape[1:])
        fan_out = filter_shape[0] * numpy.prod(filter_shape[2:]) // numpy.prod(poolsize)
        W_bound = numpy.sqrt(6.0 / (fan_in + fan_out))
        self.W = pytensor.shared(
            numpy.asarray(rng.uniform(low=-W_bound, high=W_bound, size=filter_shape),
                          dtype=pytensor.config.floatX),
            borrow=True)
        b_values = numpy.zeros((filter_shape[0],), dtype=pytensor.config.floatX)
        self.b = pytensor.shared(value=b_values, borrow=True)

        conv_out = conv2d(input=input, filters=self.W, filter_shape=filter_shape,
                          input_shape=image_shape)
        pooled_out = pool_2d(input=conv_out, ws=poolsize, ignore_border=True)
        # One bias per feature map, broadcast over the rows, the height and the width.
        self.output = T.tanh(pooled_out + self.b.dimshuffle("x", 0, "x", "x"))
        self.params = [self.W, self.b]


def evaluate_lenet5(learning_rate=0.1, n_epochs=200, dataset=None, nkerns=(20, 50),
                    batch_size=500):
    """Train with early stopping on the validation set, as the tutorial does."""
    rng = numpy.random.RandomState(23455)
    datasets, _ = load_data(dataset, side=28)
    train_set_x, train_set_y = datasets[0]
    valid_set_x, valid_set_y = datasets[1]
    test_set_x, test_set_y = datasets[2]

    n_train_batches = train_set_x.get_value(borrow=True).shape[0] // batch_size
    n_valid_batches = valid_set_x.get_value(borrow=True).shape[0] // batch_size
    n_test_batches = test_set_x.get_value(borrow=True).shape[0] // batch_size

    index = T.lscalar()  # index to a minibatch
    x = T.matrix("x")  # rasterized images
    y = T.ivector("y")  # int labels

    print("... building the model")
    # The rows of 784 pixels as a 4-d tensor (rows, channels, height, width).
    layer0_input = x.reshape((batch_size, 1, 28, 28))

    # 28x28 images, 5x5 filters: 24x24 maps, pooled to 12x12.
    layer0 = LeNetConvPoolLayer(rng, input=layer0_input, image_shape=(batch_size, 1, 28, 28),
                                filter_shape=(nkerns[0], 1, 5, 5), poolsize=(2, 2))
    # 12x12 maps, 5x5 filters: 8x8, pooled to 4x4.
    layer1 = LeNetConvPoolLayer(rng, input=layer0.output,
                                image_shape=(batch_size, nkerns[0], 12, 12),
                                filter_shape=(nkerns[1], nkerns[0], 5, 5), poolsize=(2, 2))
    # The fully connected layers take rows: (rows, nkerns[1] * 4 * 4).
    layer2_input = layer1.output.flatten(2)
    layer2 = HiddenLayer(rng, input=layer2_input, n_in=nkerns[1] * 4 * 4, n_out=500,
                         activation=T.tanh)
    layer3 = LogisticRegression(input=layer2.output, n_in=500, n_out=10)
    cost = layer3.negative_log_likelihood(y)

    test_model = pytensor.function(
        [index],
        layer3.errors(y),
        givens={
            x: test_set_x[index * batch_size: (index + 1) * batch_size],
            y: test_set_y[index * batch_size: (index + 1) * batch_size]})

    validate_model = pytensor.function(
        [index],
        layer3.errors(y),
        givens={
            x: valid_set_x[index * batch_size: (index + 1) * batch_size],
            y: valid_set_y[index * batch_size: (index + 1) * batch_size]})

    params = layer3.params + layer2.params + layer1.params + layer0.params
    grads = T.grad(cost, params)
    updates = [(param_i, param_i - learning_rate * grad_i)
               for param_i, grad_i in zip(params, grads, strict=True)]

    train_model = pytensor.function(
        [index],
        cost,
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
            iter = (epoch - 1) * n_train_batches + minibatch_index
            if iter % 100 == 0:
                print("training @ iter = ", iter)
            cost_ij = train_model(minibatch_index)
            if (iter + 1) % validation_frequency == 0:
                validation_losses = [validate_model(i) for i in range(n_valid_batches)]
                this_validation_loss = numpy.mean(validation_losses)
                print(f"epoch {epoch}, minibatch {minibatch_index + 1}/{n_train_batches}, "
                      f"validation error {this_validation_loss * 100.0:f} %, "
                      f"cost {float(cost_ij):.12f}")
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
    print("Optimization complete.")
    print(f"Best validation score of {best_validation_loss * 100.0:f} % obtained at "
          f"iteration {best_iter + 1}, with test performance {test_score * 100.0:f} %")
    print(f"The code ran for {(end_time - start_time) / 60.0:.2f}m", file=sys.stderr)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-epochs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--nkerns", default="20,50",
                        help="the two convolution layers' numbers of filters")
    parser.add_argument("--dataset", default=None,
                        help="mnist.pkl.gz or mnist.npz (default: scikit-learn's digits)")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    evaluate_lenet5(n_epochs=args.n_epochs, dataset=args.dataset, batch_size=args.batch_size,
                    nkerns=[int(k) for k in args.nkerns.split(",")])
