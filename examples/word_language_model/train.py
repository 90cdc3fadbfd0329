"""A word-level LSTM language model, after PyTorch's examples/word_language_model, trained on a
Wikitext-2-style corpus (make_corpus.py writes one offline).

    python train.py --data data/corpus --epochs 4 --seed 1

Prints one line per epoch and the test perplexity at the end, the way the PyTorch example does:

    | end of epoch   1 | time:  3.21s | valid loss  5.12 | valid ppl   167.20
    | End of training | test loss  4.98 | test ppl   145.93
"""

import argparse
import math
import time
from pathlib import Path

import torch
from torch import nn


class Corpus:
    def __init__(self, path):
        self.index = {"<eos>": 0}
        self.train, self.valid, self.test = (self.tokenize(Path(path) / f"{name}.txt")
                                             for name in ("train", "valid", "test"))

    def tokenize(self, path):
        ids = []
        for line in path.read_text().splitlines():
            for word in line.split() + ["<eos>"]:
                ids.append(self.index.setdefault(word, len(self.index)))
        return torch.tensor(ids, dtype=torch.long)


def batchify(data, batch_size):
    columns = data.size(0) // batch_size
    return data[:columns * batch_size].view(batch_size, -1).t().contiguous()


class LSTMModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout if nlayers > 1 else 0.0)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, inputs, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(inputs)), hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, batch_size):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, batch_size, self.nhid), weight.new_zeros(self.nlayers, batch_size, self.nhid))


def evaluate(model, data, bptt, ntokens, criterion):
    model.eval()
    total, hidden = 0.0, model.init_hidden(data.size(1))
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt):
            seq = min(bptt, data.size(0) - 1 - i)
            output, hidden = model(data[i:i + seq], hidden)
            total += seq * criterion(output.view(-1, ntokens), data[i + 1:i + 1 + seq].reshape(-1)).item()
    return total / (data.size(0) - 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/corpus")
    parser.add_argument("--emsize", type=int, default=32)
    parser.add_argument("--nhid", type=int, default=64)
    parser.add_argument("--nlayers", type=int, default=1)
    parser.add_argument("--lr", type=float, default=20.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--bptt", type=int, default=20)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1111)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (they change the last bits)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    corpus = Corpus(args.data)
    ntokens = len(corpus.index)
    train = batchify(corpus.train, args.batch_size)
    valid, test = batchify(corpus.valid, 10), batchify(corpus.test, 10)
    model = LSTMModel(ntokens, args.emsize, args.nhid, args.nlayers, args.dropout)
    criterion = nn.CrossEntropyLoss()
    lr = args.lr
    best = None
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        model.train()
        hidden = model.init_hidden(args.batch_size)
        for i in range(0, train.size(0) - 1, args.bptt):
            seq = min(args.bptt, train.size(0) - 1 - i)
            hidden = tuple(h.detach() for h in hidden)  # truncated backpropagation through time
            model.zero_grad()
            output, hidden = model(train[i:i + seq], hidden)
            loss = criterion(output.view(-1, ntokens), train[i + 1:i + 1 + seq].reshape(-1))
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-lr)
        val_loss = evaluate(model, valid, args.bptt, ntokens, criterion)
        print(f"| end of epoch {epoch:3d} | time: {time.time() - start:5.2f}s | valid loss {val_loss:5.2f} | "
              f"valid ppl {math.exp(val_loss):8.2f}", flush=True)
        if best is None or val_loss < best:
            best = val_loss
        else:
            lr /= 4.0  # the example's annealing: a quarter when validation stops improving
    test_loss = evaluate(model, test, args.bptt, ntokens, criterion)
    print(f"| End of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f}")


if __name__ == "__main__":
    main()
