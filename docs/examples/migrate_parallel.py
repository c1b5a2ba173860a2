"""Figure 5 today: the same program on every core, with synkhronos."""

import synkhronos as synk

from sgd_model import build_network, iter_minibatch_idxs, load_dataset, setup_training

num_epochs = 5
synk.fork()

network, input_var, param_vars = build_network()
updates, target_var, loss = setup_training(network, param_vars)

train_fn = synk.function(inputs=[input_var, target_var], outputs=loss, updates=updates)
synk.distribute()

X_train, y_train = load_dataset()
X_train, y_train = synk.data(X_train), synk.data(y_train)

for epoch in range(num_epochs):
    for batch_idxs in iter_minibatch_idxs(len(X_train), size=100, shuffle=True):
        train_fn(X_train, y_train, batch=batch_idxs)
        synk.all_reduce(param_vars, op="avg")

# Not in the figure: check that it learned, and that every process agrees.
final = synk.function(inputs=[input_var, target_var], outputs=loss)(X_train, y_train)
print(f"parallel: loss on the training set {final:.4f} ({synk.n_parallel()} processes)")
assert final < 0.3
for p in param_vars:
    for rank in range(synk.n_parallel()):
        assert (synk.get_value(rank, p) == p.get_value()).all()
synk.close()
