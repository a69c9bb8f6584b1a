"""Hard negatives on the offline world: a caption of an image with one fact changed, so that it
is false of that image's scene (NegCLIP-style text negatives for contrastive training).

The edits work on any caption the world's parser reads (the generator's references, long
captions, model captions), not on the caption templates, and every candidate is checked with the
parser against scenes.json: a "negative" that the scene does not contradict is never returned.

Kinds: shape, color, size, texture (an object's attribute), binding (two objects' colours
swapped), relation (a stated relation inverted), place (where an object sits), count, background,
added (an object the image lacks appended).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from features.world import lexicon
from features.world.parse import CaptionClaims, contradictions, match_object, parse_tokens
from features.world.scene import Scene, WorldObject

KINDS = ("shape", "color", "size", "texture", "binding", "relation", "place", "count", "background", "added")
_WORD = re.compile(r"[A-Za-z]+")
_PLACE_PHRASES = {name: ("in the center" if name == "center" else f"in the {name} corner" if " " in name
                         else f"on the {name}" if name in ("left", "right") else f"at the {name}")
                  for name in lexicon.PLACES.values()}


@dataclass
class Negative:
    kind: str
    text: str
    why: list[str]  # the claims of `text` that the scene contradicts


class _Words:
    """A caption's words with their character spans, so edits keep its casing and punctuation."""

    def __init__(self, text: str):
        self.text = text
        self.spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
        self.tokens = [text[a:b].lower() for a, b in self.spans]

    def replace(self, edits: dict[int, str]) -> str:
        """The text with word i replaced by edits[i] (a range of words by the first index; others ''),
        and the article before an edited word made to agree with it ("a red" -> "an orange")."""
        edits = dict(edits)
        for i, word in list(edits.items()):
            if word and i > 0 and i - 1 not in edits and self.tokens[i - 1] in ("a", "an"):
                edits[i - 1] = "an" if word[0].lower() in "aeiou" else "a"
        out, last = [], 0
        for i in sorted(edits):
            start, end = self.spans[i]
            word = edits[i]
            if word and self.text[start].isupper():
                word = word[0].upper() + word[1:]
            out += [self.text[last:start], word]
            last = end
        text = "".join(out) + self.text[last:]
        return re.sub(r"  +", " ", text).strip()


def hard_negatives(text: str, scene: Scene, rng: random.Random, count: int = 3,
                   kinds: tuple[str, ...] = KINDS) -> list[Negative]:
    """Up to `count` negatives of distinct kinds (chosen at random among those the caption allows)."""
    words = _Words(text)
    claims = parse_tokens(words.tokens)
    already = set(contradictions(claims, scene))  # a caption may be false already (or misread): the edit must add one
    candidates = [kind for kind in kinds if kind in _BUILDERS]
    rng.shuffle(candidates)
    found = []
    for kind in candidates:
        edited = _BUILDERS[kind](words, claims, scene, rng)
        if edited is None or edited == text:
            continue
        why = [claim for claim in contradictions(parse_tokens(_Words(edited).tokens), scene) if claim not in already]
        if why:
            found.append(Negative(kind, edited, why))
        if len(found) == count:
            break
    return found


def absent_kind(objects: Sequence[WorldObject], rng: random.Random, shape: str | None = None,
                color: str | None = None) -> tuple[str, str]:
    """A (color, shape) none of a scene's `objects` has, keeping the given one of the two when possible."""
    present = {(o.color, o.shape) for o in objects}
    shapes = [shape] if shape else list(lexicon.SHAPES)
    colors = [color] if color else list(lexicon.COLORS)
    options = [(c, s) for c in colors for s in shapes if (c, s) not in present]
    return rng.choice(options) if options else (rng.choice(list(lexicon.COLORS)), rng.choice(list(lexicon.SHAPES)))


def _shape_word(shape: str, plural: bool) -> str:
    word = lexicon.SHAPES[shape][0]
    return lexicon.plural(word) if plural else word


def _pick_mention(claims: CaptionClaims, scene: Scene, rng: random.Random, need=lambda m, o: True):
    options = [(k, m) for k, m in enumerate(claims.mentions)
               if (o := match_object(m, scene)) is not None and need(m, o)]
    return rng.choice(options) if options else (None, None)


def _shape(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    k, mention = _pick_mention(claims, scene, rng)
    if mention is None:
        return None
    present = {o.shape for o in scene.objects if mention.color in (None, o.color)}
    options = [s for s in lexicon.SHAPES if s not in present]
    if not options:
        return None
    plural = words.tokens[mention.end - 1] not in lexicon.SHAPES[mention.shape]
    return words.replace({mention.end - 1: _shape_word(rng.choice(options), plural)})


def _color(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    k, mention = _pick_mention(claims, scene, rng, lambda m, o: m.color is not None)
    if mention is None:
        return None
    color, _ = absent_kind(scene.objects, rng, shape=mention.shape)
    at = next(i for i in range(mention.start, mention.end) if words.tokens[i] in _COLOR_WORDS)
    return words.replace({at: color})


def _size(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    k, mention = _pick_mention(claims, scene, rng, lambda m, o: m.size is not None)
    if mention is None:
        return None
    at = next(i for i in range(mention.start, mention.end) if words.tokens[i] in _SIZE_WORDS)
    other = "small" if mention.size == "large" else "large"
    return words.replace({at: rng.choice(lexicon.SIZE_WORDS[other])})


def _texture(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    k, mention = _pick_mention(claims, scene, rng, lambda m, o: m.texture is not None)
    if mention is None:
        return None
    window = range(mention.start, min(len(words.tokens), mention.end + 5))
    at = next((i for i in window if words.tokens[i] in _TEXTURE_WORDS), None)
    if at is None:
        return None
    other = rng.choice([t for t in lexicon.TEXTURES if t != mention.texture])
    return words.replace({at: lexicon.TEXTURE_WORDS[other][0]})


def _binding(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    colored = [m for m in claims.mentions if m.color is not None and match_object(m, scene) is not None]
    pairs = [(a, b) for i, a in enumerate(colored) for b in colored[i + 1:] if a.color != b.color]
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    at_a = next(i for i in range(a.start, a.end) if words.tokens[i] in _COLOR_WORDS)
    at_b = next(i for i in range(b.start, b.end) if words.tokens[i] in _COLOR_WORDS)
    return words.replace({at_a: b.color, at_b: a.color})


def _relation(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    options = []
    for (subject, relation, other), span in zip(claims.relations, claims.relation_spans, strict=True):
        a, b = match_object(claims.mentions[subject], scene), match_object(claims.mentions[other], scene)
        if a is not None and b is not None and scene.holds(a.id, relation, b.id):  # clearly true: its inverse is false
            options.append((span, relation))
    if not options:
        return None
    (first, end), relation = rng.choice(options)
    phrase = rng.choice(lexicon.RELATION_PHRASES[lexicon.INVERSE[relation]]).split()
    return _replace_span(words, list(range(first, end)), phrase)


def _place(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    if not claims.places:
        return None
    mention, place, first, end = rng.choice(claims.places)
    other = rng.choice([name for name in _PLACE_PHRASES if name != place])
    return _replace_span(words, list(range(first, end)), _PLACE_PHRASES[other].split())


def _count(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    if claims.count_at is None or words.tokens[claims.count_at] == "single":
        return None
    other = rng.choice([n for n in lexicon.NUMBER_WORDS if n != len(scene.objects)])
    edits = {claims.count_at: lexicon.NUMBER_WORDS[other]}
    noun = claims.count_at + 1
    singular = words.tokens[noun].rstrip("s")
    edits[noun] = singular if other == 1 else singular + "s"
    return words.replace(edits)


def _background(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    if claims.background is None:
        return None
    at = next(i for i, w in enumerate(words.tokens[:-1]) if w in lexicon.BACKGROUNDS and words.tokens[i + 1] ==
              "background")
    return words.replace({at: rng.choice([b for b in lexicon.BACKGROUNDS if b != claims.background])})


def _added(words: _Words, claims: CaptionClaims, scene: Scene, rng: random.Random) -> str | None:
    color, shape = absent_kind(scene.objects, rng)
    size = rng.choice(list(lexicon.SIZES))
    article = "an" if color[0] in "aeiou" else "a"
    text = words.text.rstrip()
    if text.endswith("."):
        place = _PLACE_PHRASES[rng.choice(list(_PLACE_PHRASES))]
        return f"{text} There is also a {size} {color} {shape} {place} of the image."
    return f"{text} and {article} {color} {_shape_word(shape, False)}"


def _replace_span(words: _Words, span: list[int], phrase: list[str]) -> str | None:
    if not span:
        return None
    edits = {i: "" for i in span}
    edits[span[0]] = " ".join(phrase)
    return words.replace(edits)


_COLOR_WORDS = lexicon.word_index(lexicon.COLOR_WORDS)
_SIZE_WORDS = lexicon.word_index(lexicon.SIZE_WORDS)
_TEXTURE_WORDS = lexicon.word_index(lexicon.TEXTURE_WORDS)
_BUILDERS = {"shape": _shape, "color": _color, "size": _size, "texture": _texture, "binding": _binding,
             "relation": _relation, "place": _place, "count": _count, "background": _background, "added": _added}

