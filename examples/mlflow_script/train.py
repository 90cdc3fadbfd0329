"""Train a small MLP on a synthetic classification problem and log the run to MLflow.

    python train.py --lr 0.05 --epochs 10 --seed 0

Parameters go to MLflow with ``mlflow.log_params``; the training loss and the held-out accuracy
are logged every epoch with ``mlflow.log_metrics``, the training time at the end with
``mlflow.log_metric``.
"""

import argparse
import time

import mlflow
import torch
from torch import nn


def make_data(n, n_features, n_classes, generator):
    # Gaussian blobs: one centre per class, unit noise around it.
    centres = torch.randn(n_classes, n_features, generator=generator) * 0.6
    labels = torch.randint(0, n_classes, (n,), generator=generator)
    inputs = centres[labels] + torch.randn(n, n_features, generator=generator)
    return inputs, labels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(1234)  # the data set is the same whatever the seed
    x, y = make_data(args.samples, 20, 4, data_gen)
    split = args.samples * 3 // 4
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]

    model = nn.Sequential(nn.Linear(20, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    with mlflow.start_run():
        mlflow.log_params(vars(args))
        start = time.time()
        for epoch in range(args.epochs):
            model.train()
            order = torch.randperm(split)
            total = 0.0
            for i in range(0, split, args.batch_size):
                idx = order[i:i + args.batch_size]
                optimizer.zero_grad()
                loss = loss_fn(model(x_train[idx]), y_train[idx])
                loss.backward()
                optimizer.step()
                total += loss.item() * len(idx)
            model.eval()
            with torch.no_grad():
                accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
            mlflow.log_metrics({"train_loss": total / split, "test_accuracy": accuracy}, step=epoch)
            print(f"epoch {epoch + 1}/{args.epochs} loss {total / split:.4f} accuracy {accuracy:.4f}")
        mlflow.log_metric("train_time_s", time.time() - start)


if __name__ == "__main__":
    main()
