"""Hard negatives from caption text alone: one caption, one fact changed by a text edit, with no scene
graph (NegCLIP, Yuksekgonul et al. 2023; CLIP-Caption-Reward's text perturbations).

A caption is parsed once with spaCy (tags, dependencies, noun chunks); an edit then works on the parse:

- `replace_object`, `replace_attribute`, `replace_count`: one noun, adjective or number word replaced by
  another of its kind (same tag, so a plural stays plural; a colour by a colour) from the corpus;
- `swap_objects`, `swap_attributes`: two nouns, or two adjectives of different nouns, trade places;
- `invert_relation`: the two noun phrases around a preposition or verb trade places ("a cat on a
  table" -> "a table on a cat");
- `shuffle`: the caption's word trigrams in another order.

An edit that does not apply to a caption (no second noun, no number) is counted as impossible for
that kind, and another kind is tried; a caption no kind applies to is counted and named
(`EditStats`), never silently left without negatives.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

KINDS = ("replace_object", "replace_attribute", "replace_count", "swap_objects", "swap_attributes",
         "invert_relation", "shuffle")
COLORS = frozenset("white black red blue green yellow brown orange pink purple gray grey silver gold tan".split())
NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
LEXICON_SIZE = 400  # the most frequent words of each tag a replacement is drawn from


@dataclass(frozen=True)
class Parsed:
    """What the edits need of a spaCy parse, kept small (a corpus of captions is parsed once)."""

    words: tuple[str, ...]
    spaces: tuple[str, ...]
    pos: tuple[str, ...]
    tags: tuple[str, ...]
    heads: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]  # noun chunks whose root is a noun, [start, end) token spans

    def text(self, words: Sequence[str], spaces: Sequence[str] | None = None) -> str:
        return "".join(w + s for w, s in zip(words, spaces or self.spaces, strict=True)).strip()


@dataclass(frozen=True)
class Swapped:
    """Words moved with their own spacing (phrases of different lengths trade places)."""

    words: list[str]
    spaces: list[str]


@dataclass(frozen=True)
class Edit:
    kind: str
    text: str


@dataclass
class EditStats:
    """How often each kind was tried and could not apply, and the captions no kind applied to."""

    tried: Counter = field(default_factory=Counter)
    impossible: Counter = field(default_factory=Counter)
    no_edit: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rates = ", ".join(f"{k} {self.impossible[k]}/{self.tried[k]}" for k in KINDS if self.tried[k])
        shown = "; ".join(repr(c) for c in self.no_edit[:3])
        return (f"impossible edits by kind: {rates or 'none tried'}; {len(self.no_edit)} caption(s) admit no edit"
                + (f" (e.g. {shown})" if shown else ""))


def load_parser():  # -> spacy.Language
    """spaCy's English pipeline with the tagger and the dependency parser (noun chunks need both)."""
    from rewards.clip.nouns import load_spacy

    return load_spacy(parse=True)


def parse_all(texts: Iterable[str], nlp=None, batch_size: int = 512) -> dict[str, Parsed]:
    nlp = nlp or load_parser()
    unique = list(dict.fromkeys(texts))
    parsed = {}
    for text, doc in zip(unique, nlp.pipe(unique, batch_size=batch_size), strict=True):
        parsed[text] = Parsed(tuple(t.text for t in doc), tuple(t.whitespace_ for t in doc),
                              tuple(t.pos_ for t in doc), tuple(t.tag_ for t in doc), tuple(t.head.i for t in doc),
                              tuple((c.start, c.end) for c in doc.noun_chunks if c.root.pos_ == "NOUN"))
    return parsed


def build_lexicon(parsed: Iterable[Parsed]) -> dict[str, list[str]]:
    """The corpus's frequent words by fine tag (NN, NNS, JJ), lower-cased."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for p in parsed:
        for word, pos, tag in zip(p.words, p.pos, p.tags, strict=True):
            if pos in ("NOUN", "ADJ") and word.isalpha():
                counts[tag][word.lower()] += 1
    return {tag: [w for w, _ in c.most_common(LEXICON_SIZE)] for tag, c in counts.items()}


class TextEditor:
    """Negatives of captions by text edits; `prepare` parses a corpus once (and builds the lexicon
    replacements come from), `edits` draws up to `count` negatives of distinct kinds."""

    def __init__(self, corpus: Iterable[str], kinds: Sequence[str] = KINDS, nlp=None):
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            from plumbing.errors import ConfigError

            raise ConfigError(f"unknown text edit {unknown[0]!r}; the kinds are {', '.join(KINDS)}")
        self.nlp = nlp or load_parser()
        self.parsed = parse_all(corpus, self.nlp)
        self.lexicon = build_lexicon(self.parsed.values())
        self.kinds = tuple(kinds)
        self.stats = EditStats()

    def parse(self, caption: str) -> Parsed:
        if caption not in self.parsed:
            self.parsed.update(parse_all([caption], self.nlp))
        return self.parsed[caption]

    def edits(self, caption: str, rng: random.Random, count: int = 3) -> list[Edit]:
        parsed = self.parse(caption)
        out, seen = [], {caption.strip().lower()}
        for kind in rng.sample(self.kinds, len(self.kinds)):
            if len(out) == count:
                break
            self.stats.tried[kind] += 1
            text = as_text(parsed, EDITS[kind](parsed, rng, self.lexicon))
            if text is None or text.lower() in seen:
                self.stats.impossible[kind] += 1
                continue
            seen.add(text.lower())
            out.append(Edit(kind, text))
        if not out and len(self.stats.no_edit) < 1000:
            self.stats.no_edit.append(caption)
        return out


def as_text(parsed: Parsed, edited: list[str] | Swapped | None) -> str | None:
    if edited is None:
        return None
    if isinstance(edited, Swapped):
        return parsed.text(edited.words, edited.spaces)
    return parsed.text(edited)


def _replace(parsed: Parsed, rng: random.Random, choose: Callable[[int], list[str]]) -> list[str] | None:
    """One word replaced by another of `choose(index)` (the candidates for that position)."""
    options = [(i, [w for w in choose(i) if w != parsed.words[i].lower()]) for i in range(len(parsed.words))]
    options = [(i, words) for i, words in options if words]
    if not options:
        return None
    index, words = rng.choice(options)
    new = rng.choice(words)
    old = parsed.words[index]
    words_out = list(parsed.words)
    words_out[index] = new.capitalize() if old[:1].isupper() else new
    if index and words_out[index - 1].lower() in ("a", "an"):  # the article agrees with its new word
        article = "an" if new[:1].lower() in "aeiou" else "a"
        words_out[index - 1] = article.capitalize() if words_out[index - 1][:1].isupper() else article
    return words_out


def replace_object(parsed: Parsed, rng: random.Random, lexicon: dict[str, list[str]]) -> list[str] | None:
    return _replace(parsed, rng, lambda i: lexicon.get(parsed.tags[i], [])
                    if parsed.pos[i] == "NOUN" and parsed.tags[i] in ("NN", "NNS") and parsed.words[i].isalpha()
                    else [])


def replace_attribute(parsed: Parsed, rng: random.Random, lexicon: dict[str, list[str]]) -> list[str] | None:
    def choose(i: int) -> list[str]:
        if parsed.pos[i] != "ADJ" or not parsed.words[i].isalpha():
            return []
        if parsed.words[i].lower() in COLORS:
            return sorted(COLORS - {"grey"})
        return [w for w in lexicon.get(parsed.tags[i], []) if w not in COLORS]

    return _replace(parsed, rng, choose)


def replace_count(parsed: Parsed, rng: random.Random, lexicon: dict[str, list[str]]) -> list[str] | None:
    def choose(i: int) -> list[str]:
        word = parsed.words[i].lower()
        if word in NUMBERS:
            return list(NUMBERS)
        if word.isdigit() and parsed.pos[i] == "NUM" and int(word) >= 2:
            return [str(n) for n in range(2, 11)]
        return []

    return _replace(parsed, rng, choose)


def _swap(parsed: Parsed, rng: random.Random, pairs: list[tuple[int, int]]) -> list[str] | None:
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    words = list(parsed.words)
    words[a], words[b] = words[b], words[a]
    return words


def swap_objects(parsed: Parsed, rng: random.Random, lexicon: dict[str, list[str]]) -> list[str] | None:
    nouns = [i for i, (pos, tag) in enumerate(zip(parsed.pos, parsed.tags, strict=True))
             if pos == "NOUN" and parsed.words[i].isalpha()]
    return _swap(parsed, rng, [(a, b) for a in nouns for b in nouns if a < b and parsed.tags[a] == parsed.tags[b]
                               and parsed.words[a].lower() != parsed.words[b].lower()])


def swap_attributes(parsed: Parsed, rng: random.Random, lexicon: dict[str, list[str]]) -> list[str] | None:
    adjectives = [i for i, pos in enumerate(parsed.pos) if pos == "ADJ" and parsed.words[i].isalpha()]
    return _swap(parsed, rng, [(a, b) for a in adjectives for b in adjectives if a < b
                               and parsed.heads[a] != parsed.heads[b]
                               and parsed.words[a].lower() != parsed.words[b].lower()])


def invert_relation(parsed: Parsed, rng: random.Random, lexicon: dict[str, list[str]]) -> Swapped | None:
    """Two consecutive noun chunks with a preposition or verb (and no other chunk) between them swap."""
    pairs = []
    for (s1, e1), (s2, e2) in zip(parsed.chunks, parsed.chunks[1:], strict=False):
        between = range(e1, s2)
        if between and any(parsed.pos[i] in ("ADP", "VERB", "AUX") for i in between) \
                and [w.lower() for w in parsed.words[s1:e1]] != [w.lower() for w in parsed.words[s2:e2]]:
            pairs.append(((s1, e1), (s2, e2)))
    if not pairs:
        return None
    (s1, e1), (s2, e2) = rng.choice(pairs)
    tokens = [list(t) for t in zip(parsed.words, parsed.spaces, strict=True)]
    first, second = tokens[s1:e1], tokens[s2:e2]
    # each phrase takes the space that followed the place it moves to; a capital stays at the start
    first[-1][1], second[-1][1] = parsed.spaces[e2 - 1], parsed.spaces[e1 - 1]
    if s1 == 0 and first[0][0][:1].isupper():
        first[0][0], second[0][0] = first[0][0][:1].lower() + first[0][0][1:], second[0][0].capitalize()
    moved = tokens[:s1] + second + tokens[e1:s2] + first + tokens[e2:]
    return Swapped([w for w, _ in moved], [sp for _, sp in moved])


def shuffle(parsed: Parsed, rng: random.Random, lexicon: dict[str, list[str]]) -> Swapped | None:
    """The word trigrams (punctuation at the end kept there) in another order, each with its own spacing."""
    tokens = [list(t) for t in zip(parsed.words, parsed.spaces, strict=True)]
    tail = []
    while tokens and not tokens[-1][0].isalnum():
        tail.insert(0, tokens.pop())
    grams = [tokens[i:i + 3] for i in range(0, len(tokens), 3)]
    if len(grams) < 2:
        return None
    order = list(range(len(grams)))
    while order == sorted(order):
        rng.shuffle(order)
    moved = [token for k in order for token in grams[k]]
    for gram in grams:
        gram[-1][1] = " "
    moved[-1][1] = parsed.spaces[len(tokens) - 1]
    moved += tail
    return Swapped([w for w, _ in moved], [sp for _, sp in moved])


EDITS: dict[str, Callable[[Parsed, random.Random, dict[str, list[str]]], list[str] | Swapped | None]] = {
    "replace_object": replace_object, "replace_attribute": replace_attribute, "replace_count": replace_count,
    "swap_objects": swap_objects, "swap_attributes": swap_attributes, "invert_relation": invert_relation,
    "shuffle": shuffle}
