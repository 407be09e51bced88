"""Diversity and repetition of generated text."""

from __future__ import annotations

from collections.abc import Sequence


def _tokens(x) -> list:
    return x.split() if isinstance(x, str) else list(x)


def _ngrams(tokens: list, n: int) -> list[tuple]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(texts: Sequence, n: int) -> float:
    """Corpus-level distinct-n: unique n-grams / total n-grams over all texts (strings are split on
    whitespace; token lists are used as given). 0.0 when there is no n-gram."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [g for t in texts for g in _ngrams(_tokens(t), n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_ratio(tokens) -> float:
    """Share of tokens equal to the token right before them (the first token never is)."""
    toks = _tokens(tokens)
    if not toks:
        return 0.0
    return sum(a == b for a, b in zip(toks[1:], toks[:-1])) / len(toks)


def rep_n(tokens, n: int) -> float:
    """seq-rep-n (Welleck et al., 2019): 1 - unique n-grams / n-grams within one sequence."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = _ngrams(_tokens(tokens), n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0
