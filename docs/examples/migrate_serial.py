"""Figure 4 today: the serial program, in plain PyTensor."""

import pytensor

from sgd_model import build_network, iter_minibatch_idxs, load_dataset, setup_training

num_epochs = 5

network, input_var, param_vars = build_network()
updates, target_var, loss = setup_training(network, param_vars)

train_fn = pytensor.function(inputs=[input_var, target_var], outputs=loss, updates=updates)

X_train, y_train = load_dataset()

for epoch in range(num_epochs):
    for batch_idxs in iter_minibatch_idxs(len(X_train), size=100, shuffle=True):
        train_fn(X_train[batch_idxs], y_train[batch_idxs])

# Not in the figure: check that it learned.
final = pytensor.function([input_var, target_var], loss)(X_train, y_train)
print(f"serial:   loss on the training set {final:.4f}")
assert final < 0.3
