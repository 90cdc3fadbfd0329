"""Softmax regression on synthetic data with plain numpy; progress and results are printed.

    python train.py --epochs 5 --lr 0.5 --seed 1

The final lines look like the PyTorch ImageNet example's:

    * Acc@1 87.500 Acc@5 100.000
"""

import argparse
import time

import numpy as np


def make_data(rng, n, n_features=32, n_classes=8):
    centres = rng.normal(scale=0.45, size=(n_classes, n_features))
    labels = rng.integers(0, n_classes, size=n)
    return centres[labels] + rng.normal(size=(n, n_features)), labels


def accuracy_at(logits, labels, k):
    top = np.argsort(-logits, axis=1)[:, :k]
    return 100.0 * np.mean(np.any(top == labels[:, None], axis=1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    x, y = make_data(np.random.default_rng(2024), 6000)  # the same data for every seed
    x_train, y_train, x_val, y_val = x[:5000], y[:5000], x[5000:], y[5000:]
    rng = np.random.default_rng(args.seed)
    w = rng.normal(scale=0.01, size=(x.shape[1], 8))
    b = np.zeros(8)

    start = time.time()
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_train))
        losses = []
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            logits = x_train[idx] @ w + b
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            losses.append(-np.mean(np.log(p[np.arange(len(idx)), y_train[idx]] + 1e-12)))
            p[np.arange(len(idx)), y_train[idx]] -= 1
            w -= args.lr * x_train[idx].T @ p / len(idx)
            b -= args.lr * p.mean(axis=0)
        print(f"Epoch: [{epoch}] loss {np.mean(losses):.4f} time {time.time() - start:.2f}s")
        val = x_val @ w + b
        print(f" * Acc@1 {accuracy_at(val, y_val, 1):.3f} Acc@5 {accuracy_at(val, y_val, 5):.3f}")


if __name__ == "__main__":
    main()
