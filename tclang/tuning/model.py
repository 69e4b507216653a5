"""The cost model that guides the search: gradient-boosted regression trees over the
candidates' features, fitted online to the log of the measured times (as TVM's Ansor and
MetaSchedule guide their evolutionary search with XGBoost).

Written here rather than taken from scikit-learn or XGBoost: the tuner fits at most a few
hundred points of a few dozen features, where forty depth-3 trees on NumPy take
milliseconds, and a heavy dependency for that would be out of proportion. Its job is only
to rank: which of a few hundred mutated candidates are worth compiling and timing.
"""

from __future__ import annotations

import numpy as np


class _Tree:
    """A regression tree of fixed depth, splits chosen by squared error."""

    def __init__(self, depth: int, min_leaf: int):
        self.depth, self.min_leaf = depth, min_leaf
        self.nodes: list = []

    def fit(self, x: np.ndarray, y: np.ndarray) -> "_Tree":
        self.root = self._grow(x, y, self.depth)
        return self

    def _grow(self, x, y, depth):
        if depth == 0 or len(y) < 2 * self.min_leaf or np.ptp(y) == 0:
            return float(y.mean())
        best = None
        total, count = y.sum(), len(y)
        for f in range(x.shape[1]):
            order = np.argsort(x[:, f], kind="stable")
            xs, ys = x[order, f], y[order]
            left_sum = np.cumsum(ys)[:-1]
            n_left = np.arange(1, count)
            valid = (xs[1:] != xs[:-1]) & (n_left >= self.min_leaf) & \
                (count - n_left >= self.min_leaf)
            if not valid.any():
                continue
            # minimising squared error = maximising sum^2/n on both sides
            gain = left_sum ** 2 / n_left + (total - left_sum) ** 2 / (count - n_left)
            gain[~valid] = -np.inf
            k = int(np.argmax(gain))
            if best is None or gain[k] > best[0]:
                best = (gain[k], f, (xs[k] + xs[k + 1]) / 2)
        if best is None:
            return float(y.mean())
        _, f, threshold = best
        left = x[:, f] <= threshold
        return (f, threshold, self._grow(x[left], y[left], depth - 1),
                self._grow(x[~left], y[~left], depth - 1))

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.array([self._one(row, self.root) for row in x])

    @staticmethod
    def _one(row, node):
        while isinstance(node, tuple):
            f, threshold, left, right = node
            node = left if row[f] <= threshold else right
        return node


class BoostedTrees:
    """Sum of `rounds` shallow trees, each fitted to what the ones before left over."""

    def __init__(self, rounds: int = 40, depth: int = 3, learning_rate: float = 0.3,
                 min_leaf: int = 2):
        self.rounds, self.depth = rounds, depth
        self.learning_rate, self.min_leaf = learning_rate, min_leaf
        self.trees: list[_Tree] = []
        self.base = 0.0

    def fit(self, x: np.ndarray, y: np.ndarray) -> "BoostedTrees":
        self.base = float(np.mean(y))
        residual = y - self.base
        self.trees = []
        for _ in range(self.rounds):
            tree = _Tree(self.depth, self.min_leaf).fit(x, residual)
            step = self.learning_rate * tree.predict(x)
            if not np.any(step):
                break
            residual = residual - step
            self.trees.append(tree)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = np.full(len(x), self.base)
        for tree in self.trees:
            out += self.learning_rate * tree.predict(x)
        return out
