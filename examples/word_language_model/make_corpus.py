"""Write a word-level corpus for train.py: train.txt, valid.txt and test.txt under --out.

Offline and deterministic: a seeded Markov "language" over a vocabulary of --vocab words in
which each word is followed by one of --branch others, Zipf-distributed, so the model has
structure to learn and a perplexity far below the vocabulary size to reach (the language's own
is about 5 with the defaults: no model does better).
The layout is Wikitext-2's (one sentence a line, words separated by spaces), which is what
train.py reads; point --data at a real Wikitext-2 download instead and it trains on that.

    python make_corpus.py --out data/corpus --tokens 60000
"""

import argparse
import random
from pathlib import Path


def sentences(rng, vocab, total_tokens, branch):
    words = [f"w{i}" for i in range(vocab)]
    weights = [1.0 / (rank + 1) for rank in range(branch)]  # Zipf over each context's continuations
    table = {}
    made, context = 0, 0
    while made < total_tokens:
        length = rng.randint(6, 18)
        line = []
        for _ in range(length):
            if context not in table:  # each context's continuations, drawn once
                table[context] = rng.sample(range(vocab), branch)
            word = rng.choices(table[context], weights)[0]
            line.append(words[word])
            context = word
        made += length
        yield " ".join(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/corpus")
    parser.add_argument("--tokens", type=int, default=60000, help="words in train.txt (valid and test get a tenth)")
    parser.add_argument("--vocab", type=int, default=500)
    parser.add_argument("--branch", type=int, default=8, help="the words that may follow each word")
    parser.add_argument("--seed", type=int, default=2)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stream = sentences(rng, args.vocab, args.tokens * 12 // 10, args.branch)
    lines = list(stream)
    cut1, cut2 = len(lines) * 10 // 12, len(lines) * 11 // 12
    for name, part in (("train.txt", lines[:cut1]), ("valid.txt", lines[cut1:cut2]), ("test.txt", lines[cut2:])):
        (out / name).write_text("\n".join(part) + "\n")
    print(f"wrote {out}/train.txt, valid.txt, test.txt ({len(lines)} sentences)")


if __name__ == "__main__":
    main()
