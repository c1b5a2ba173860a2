"""The LSTM tutorial's ``imdb.py``: ``load_data`` and ``prepare_data``.

As in the Deep Learning Tutorials (``imdb.py``, BSD license, see NOTICE.txt), a data
set is three ``(sequences, labels)`` pairs, train, valid and test: each sequence a
list of word indices (0 is never a word: it pads; 1 stands for every word beyond the
vocabulary of ``n_words``), each label 0 or 1. ``prepare_data`` pads a minibatch of
them into the time-major matrices the LSTM reads. The data come from local files
only, never from the network:

- by default, a synthetic IMDB drawn with a fixed seed: a vocabulary of 1000 words,
  of which 10 are "positive" and 10 "negative". Each sequence, of 10 to 60 words, is
  drawn in a mood, good or bad: each word is a sentiment word with probability 0.3
  (of the mood's kind with probability 0.8) and otherwise one of the 978 others. The
  label is 1 when the sequence holds more positive than negative words (a sequence
  with as many of each is drawn again), so it depends on the words alone. 2000
  sequences for training (of which ``valid_portion`` are held out for validation)
  and 500 for testing. The tutorial's LSTM (dim_proj 16, ADADELTA) learns it in
  the second epoch, to a few percent of errors;
- ``path="imdb.pkl"`` (or ``.pkl.gz``): the tutorial's own IMDB file, two pickled
  ``(sequences, labels)`` tuples, train then test.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy
import pytensor

__all__ = ["load_data", "prepare_data"]

N_WORDS = 1000  # the synthetic vocabulary, 0 and 1 included
POSITIVE = numpy.arange(2, 12)
NEGATIVE = numpy.arange(12, 22)
NEUTRAL = numpy.arange(22, N_WORDS)


def prepare_data(seqs, labels, maxlen=None):
    """A minibatch as matrices: ``x`` (int64) and ``mask`` (floatX), both of shape
    ``(longest sequence, n_samples)``, each sequence down a column padded with 0 (mask
    1 where a word is), and the labels as an int64 array. With ``maxlen``, sequences
    of ``maxlen`` words or more are left out (``None, None, None`` if none is left)."""
    lengths = [len(s) for s in seqs]
    if maxlen is not None:
        kept = [(s, y, n) for s, y, n in zip(seqs, labels, lengths, strict=True) if n < maxlen]
        if not kept:
            return None, None, None
        seqs, labels, lengths = zip(*kept, strict=True)

    n_samples = len(seqs)
    longest = numpy.max(lengths)
    x = numpy.zeros((longest, n_samples), dtype="int64")
    x_mask = numpy.zeros((longest, n_samples), dtype=pytensor.config.floatX)
    for idx, s in enumerate(seqs):
        x[:lengths[idx], idx] = s
        x_mask[:lengths[idx], idx] = 1.0
    return x, x_mask, numpy.asarray(labels, dtype="int64")


def _synthetic(n_samples, rng):
    """``n_samples`` sequences and their labels (see the module docstring)."""
    seqs, labels = [], []
    while len(seqs) < n_samples:
        length = rng.randint(10, 61)
        good = rng.randint(2) == 1
        sentiment = rng.uniform(size=length) < 0.3
        positive = sentiment & ((rng.uniform(size=length) < 0.8) == good)
        negative = sentiment & ~positive
        words = numpy.where(positive, rng.choice(POSITIVE, size=length),
                            numpy.where(negative, rng.choice(NEGATIVE, size=length),
                                        rng.choice(NEUTRAL, size=length)))
        n_pos, n_neg = int(positive.sum()), int(negative.sum())
        if n_pos == n_neg:
            continue
        seqs.append([int(w) for w in words])
        labels.append(int(n_pos > n_neg))
    return seqs, labels


def _pickled(path):
    file = Path(path)
    if not file.is_file():
        raise SystemExit(f"--dataset: no such file {path!r}")
    with (gzip.open(file, "rb") if file.name.endswith(".gz") else open(file, "rb")) as f:
        train_set = pickle.load(f, encoding="latin1")  # written by Python 2
        test_set = pickle.load(f, encoding="latin1")
    return train_set, test_set


def load_data(path=None, n_words=N_WORDS, valid_portion=0.05, maxlen=None,
              sort_by_len=True, n_train=2000, n_test=500):
    """``train, valid, test``: three ``(sequences, labels)`` pairs of lists.

    ``path``: the tutorial's ``imdb.pkl``; by default the synthetic set of ``n_train``
    and ``n_test`` sequences. As the tutorial does: ``valid_portion`` of the training
    sequences, drawn at random (from ``numpy.random``'s global state, as the tutorial
    draws them), are held out for validation; with ``maxlen``, training sequences of
    ``maxlen`` words or more are dropped; words ``>= n_words`` become 1; with
    ``sort_by_len``, each set is sorted by length (minibatches of similar lengths need
    less padding)."""
    if path is None:
        rng = numpy.random.RandomState(1234)  # the data never change
        train_set, test_set = _synthetic(n_train, rng), _synthetic(n_test, rng)
    else:
        train_set, test_set = _pickled(path)

    if maxlen:
        kept = [(x, y) for x, y in zip(*train_set, strict=True) if len(x) < maxlen]
        train_set = ([x for x, _ in kept], [y for _, y in kept])

    train_set_x, train_set_y = train_set
    n_samples = len(train_set_x)
    sidx = numpy.random.permutation(n_samples)
    n_train_kept = int(numpy.round(n_samples * (1.0 - valid_portion)))
    valid_set = ([train_set_x[s] for s in sidx[n_train_kept:]],
                 [train_set_y[s] for s in sidx[n_train_kept:]])
    train_set = ([train_set_x[s] for s in sidx[:n_train_kept]],
                 [train_set_y[s] for s in sidx[:n_train_kept]])

    def remove_unk(x):
        return [[1 if w >= n_words else w for w in sen] for sen in x]

    def by_length(xs, ys):
        xs = remove_unk(xs)
        if sort_by_len:
            order = sorted(range(len(xs)), key=lambda i: len(xs[i]))
            xs, ys = [xs[i] for i in order], [ys[i] for i in order]
        return xs, list(ys)

    return by_length(*train_set), by_length(*valid_set), by_length(*test_set)
