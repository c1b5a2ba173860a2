"""A small Lasagne-style network library on plain PyTensor, so the demos read like Lasagne code.

The original Synkhronos demos built their networks with Lasagne. Lasagne itself
cannot be used today: its last release (0.1) and its development branch import
``theano.tensor.signal.pool``, ``theano.tensor.nnet`` and ``theano.sandbox.cuda``,
which no working Theano (the last, 1.0.5, fails on current NumPy and Python) or any
PyTensor provides; PyTensor 3 has no ``tensor.nnet`` at all (no conv2d, no pooling,
no batch normalization). This package, which lives in ``demos/`` and is not part of
synkhronos, offers the part of Lasagne's interface the demos use, with Lasagne's
names, arguments, defaults and shape conventions (images are ``(rows, channels,
height, width)``), so a demo script reads like its Lasagne original::

    import lasagne_like as lasagne

    network = lasagne.layers.InputLayer(shape=(None, 1, 28, 28), input_var=x)
    network = lasagne.layers.DenseLayer(network, 800,
                                        nonlinearity=lasagne.nonlinearities.rectify)
    prediction = lasagne.layers.get_output(network)
    params = lasagne.layers.get_all_params(network, trainable=True)

Modules: :mod:`.layers` (InputLayer, DenseLayer, DropoutLayer, Conv2DLayer,
MaxPool2DLayer, Pool2DLayer, GlobalPoolLayer, BatchNormLayer, NonlinearityLayer,
ElemwiseSumLayer, get_output, get_all_params, ...), :mod:`.init`,
:mod:`.nonlinearities`, :mod:`.objectives`, :mod:`.updates` (the serial rules, as
Lasagne's) and :mod:`.random` (the generator that initializers and dropout draw
seeds from; ``numpy.random`` by default, as in Lasagne).

Everything is plain PyTensor underneath: convolution and pooling are synkhronos'
ports of Theano's ``conv2d`` and ``pool_2d`` (:mod:`synkhronos.extensions.conv`:
im2col and one matrix product; a maximum or mean over shifted slices, or a reshape
where windows tile the image), and every graph compiles with PyTensor's default
(Numba) backend and with its JAX backend. For JAX every shape must be concrete when
traced, so the layers compute all shapes in Python from the layers'
``output_shape`` and take only the number of rows from the input itself
(``x.shape[0]``, never arithmetic on it).
"""

from . import init, layers, nonlinearities, objectives, random, updates

__all__ = ["init", "layers", "nonlinearities", "objectives", "random", "updates"]
