"""Reading caption text back into claims about a scene, and checking them against scenes.json.

The parser knows only the world's vocabulary (lexicon.py), not the caption templates, so it
reads model captions and reference captions alike: object mentions (shape with the colour,
size and texture words right before it), spatial relations between mentions, where a mention
sits in the image, the object count and the background colour. `contradictions` lists every
claim of a caption that the scene contradicts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from features.world import lexicon
from features.world.scene import Scene, WorldObject
from plumbing.ptb import ptb_tokenize

_SHAPE_WORDS = lexicon.shape_word_index()
_COLOR_WORDS = lexicon.word_index(lexicon.COLOR_WORDS)
_SIZE_WORDS = lexicon.word_index(lexicon.SIZE_WORDS)
_TEXTURE_WORDS = lexicon.word_index(lexicon.TEXTURE_WORDS)
_RELATION_PATTERNS = sorted(
    ((tuple(phrase.split()), rel) for rel, phrases in lexicon.RELATION_PHRASES.items() for phrase in phrases),
    key=lambda item: -len(item[0]),
)
_ARTICLES = {"a", "an", "the"}


def _by_first_word(patterns: list[tuple[tuple[str, ...], str]]) -> dict[str, list[tuple[tuple[str, ...], str]]]:
    """The patterns grouped by their first word, longest first within each group: a position is only
    tried against the phrases that can start there (the recipes parse every hard negative they make)."""
    groups: dict[str, list[tuple[tuple[str, ...], str]]] = {}
    for phrase, name in patterns:
        groups.setdefault(phrase[0], []).append((phrase, name))
    return groups


def _match_at(tokens: list[str], i: int, groups: dict) -> tuple[tuple[str, ...], str] | None:
    """The longest pattern that starts at tokens[i], with its name."""
    return next(((p, n) for p, n in groups.get(tokens[i], ()) if tuple(tokens[i:i + len(p)]) == p), None)


_RELATIONS_BY_FIRST = _by_first_word(_RELATION_PATTERNS)
_COUNT_NOUNS = {"shape", "shapes", "object", "objects"}
_NUMBERS = {word: n for n, word in lexicon.NUMBER_WORDS.items()}


@dataclass
class Mention:
    shape: str
    color: str | None
    size: str | None
    texture: str | None
    start: int  # token index of the first word of the phrase (after any article)
    end: int  # token index after the shape word


@dataclass
class CaptionClaims:
    mentions: list[Mention] = field(default_factory=list)
    relations: list[tuple[int, str, int]] = field(default_factory=list)  # mention indices
    relation_spans: list[tuple[int, int]] = field(default_factory=list)  # tokens of each relation phrase
    places: list[tuple[int, str, int, int]] = field(default_factory=list)  # (mention, place, first, end token)
    count: int | None = None
    count_at: int | None = None  # token index of the number word
    background: str | None = None


def parse_caption(text: str) -> CaptionClaims:
    return parse_tokens(ptb_tokenize(text).split())


def parse_tokens(tokens: list[str]) -> CaptionClaims:
    """Claims of a lowercased word sequence (punctuation removed, as ptb_tokenize leaves it)."""
    claims = CaptionClaims(mentions=_mentions(tokens))
    found = _relations(tokens, claims.mentions)
    claims.relations = [r for r, _ in found]
    claims.relation_spans = [span for _, span in found]
    claims.places = _places(tokens, claims.mentions)
    claims.count, claims.count_at = _count(tokens)
    claims.background = _background(tokens)
    return claims


# "in the center", "on the left", "at the top", "in the top left corner": place phrases of the world
_PLACE_PATTERNS = sorted(
    [(tuple(phrase.split()), name) for name in lexicon.PLACES.values()
     for phrase in (f"in the {name} corner" if " " in name else
                    "in the center" if name == "center" else
                    f"on the {name}" if name in ("left", "right") else f"at the {name}",)],
    key=lambda item: -len(item[0]),
)
_PLACES_BY_FIRST = _by_first_word(_PLACE_PATTERNS)


def _places(tokens: list[str], mentions: list[Mention]) -> list[tuple[int, str, int, int]]:
    """A place phrase belongs to the last mention before it, when no other mention comes between. One
    that goes on to name an object ("on the left of a blue square") places it against that object,
    not in the image: it is no place claim (a relation phrase, where the world has one)."""
    starts = {m.start for m in mentions}
    found = []
    i = 0
    while i < len(tokens):
        match = _match_at(tokens, i, _PLACES_BY_FIRST)
        if match is None:
            i += 1
            continue
        phrase, name = match
        end = i + len(phrase)
        owner = max((k for k, m in enumerate(mentions) if m.end <= i), default=None, key=lambda k: mentions[k].end)
        if owner is not None and not _names_an_object_after(tokens, end, starts):
            found.append((owner, name, i, end))
        i = end
    return found


def _names_an_object_after(tokens: list[str], end: int, mention_starts: set[int]) -> bool:
    """tokens[end:] reads "of [articles] <a mention>"."""
    if end >= len(tokens) or tokens[end] != "of":
        return False
    k = end + 1
    while k < len(tokens) and tokens[k] in _ARTICLES:
        k += 1
    return k in mention_starts


def _mentions(tokens: list[str]) -> list[Mention]:
    found = []
    for i, word in enumerate(tokens):
        shape = _SHAPE_WORDS.get(word)
        if shape is None:
            continue
        attrs = {"color": None, "size": None, "texture": None}
        start = i
        while start > 0:
            prev = tokens[start - 1]
            kind = _attribute_kind(prev)
            if kind is None or attrs[kind] is not None:
                break
            attrs[kind] = {"color": _COLOR_WORDS, "size": _SIZE_WORDS, "texture": _TEXTURE_WORDS}[kind][prev]
            start -= 1
        texture = attrs["texture"] or _trailing_texture(tokens[i + 1:i + 5])
        found.append(Mention(shape, attrs["color"], attrs["size"], texture, start, i + 1))
    return found


def _trailing_texture(window: list[str]) -> str | None:
    """Texture stated after the noun: "... star with a striped pattern", "filled with one plain color"."""
    if not window or window[0] not in ("with", "filled"):
        return None
    return next((_TEXTURE_WORDS[w] for w in window[1:] if w in _TEXTURE_WORDS), None)


def _attribute_kind(word: str) -> str | None:
    if word in _COLOR_WORDS:
        return "color"
    if word in _SIZE_WORDS:
        return "size"
    if word in _TEXTURE_WORDS:
        return "texture"
    return None


def _relations(tokens: list[str], mentions: list[Mention]) -> list[tuple[tuple[int, str, int], tuple[int, int]]]:
    relations = []
    i = 0
    while i < len(tokens):
        match = _match_at(tokens, i, _RELATIONS_BY_FIRST)
        if match is None:
            i += 1
            continue
        phrase, relation = match
        after = i + len(phrase)
        subject = max((k for k, m in enumerate(mentions) if m.end <= i), default=None, key=lambda k: mentions[k].end)
        obj = next((k for k, m in enumerate(mentions) if m.start >= after), None)
        if subject is not None and obj is not None and set(tokens[after:mentions[obj].start]) <= _ARTICLES:
            relations.append(((subject, relation, obj), (i, after)))
        i = after
    return relations


def _count(tokens: list[str]) -> tuple[int | None, int | None]:
    for k, (word, nxt) in enumerate(itertools.pairwise(tokens)):
        if word in _NUMBERS and nxt in _COUNT_NOUNS:
            return _NUMBERS[word], k
    return (1, tokens.index("single")) if "single" in tokens else (None, None)


def _background(tokens: list[str]) -> str | None:
    for k, word in enumerate(tokens[1:], start=1):
        if word == "background" and tokens[k - 1] in lexicon.BACKGROUNDS:
            return tokens[k - 1]
    return None


def match_object(mention: Mention, scene: Scene) -> WorldObject | None:
    """The scene object a mention names: same shape and (when stated) same colour, and of those the
    first whose size and texture agree best with the mention's words ("a small hexagon" in a scene of
    a large and a small hexagon is the small one)."""
    closest = _closest(_readings(mention, scene))
    return None if closest is None else closest[0]


def _readings(mention: Mention, scene: Scene) -> list[tuple[WorldObject, list[str]]]:
    """Every object the mention may name, with its attribute errors (each computed once), in scene
    order: those of its shape and (when stated) colour that agree with all its words, else every
    object of its shape and colour."""
    candidates = [(obj, attribute_errors(mention, obj)) for obj in scene.objects
                  if obj.shape == mention.shape and mention.color in (None, obj.color)]
    return [reading for reading in candidates if not reading[1]] or candidates


def _closest(readings: list[tuple[WorldObject, list[str]]]) -> tuple[WorldObject, list[str]] | None:
    """Of a mention's readings, the first with the fewest attribute errors (None: it names nothing)."""
    return min(readings, key=lambda reading: len(reading[1]), default=None)


def attribute_errors(mention: Mention, obj: WorldObject) -> list[str]:
    """Stated size/texture words that contradict the matched object."""
    wrong = []
    if mention.size is not None and mention.size != obj.size:
        wrong.append("size")
    if mention.texture is not None and mention.texture != obj.texture:
        wrong.append("texture")
    return wrong


def contradictions(claims: CaptionClaims, scene: Scene) -> list[str]:
    """Every claim the scene contradicts: a named object it lacks, a wrong size or texture, a
    relation whose inverse holds, a wrong place, count or background. [] for a true caption."""
    wrong = []
    readings = [_readings(m, scene) for m in claims.mentions]
    for mention, closest in zip(claims.mentions, map(_closest, readings), strict=True):
        if closest is None:
            wrong.append(f"no {mention.color or ''} {mention.shape}".replace("  ", " "))
        else:
            obj, errors = closest
            wrong += [f"{kind} of the {obj.color} {obj.shape}" for kind in errors]
    objects = [[obj for obj, _ in named] for named in readings]
    for subject, relation, other in claims.relations:  # false only if false of every reading of the two
        pairs = [(a, b) for a in objects[subject] for b in objects[other] if a.id != b.id]
        if pairs and all(scene.holds(a.id, lexicon.INVERSE[relation], b.id) for a, b in pairs):
            a, b = pairs[0]
            wrong.append(f"the {a.color} {a.shape} is not {relation} the {b.color} {b.shape}")
    for mention, place, _, _ in claims.places:
        objs = objects[mention]
        if objs and all(obj.place != place for obj in objs):
            wrong.append(f"the {objs[0].color} {objs[0].shape} is not at {place}")
    if claims.count is not None and claims.count != len(scene.objects):
        wrong.append(f"{len(scene.objects)} objects, not {claims.count}")
    if claims.background is not None and claims.background != scene.background:
        wrong.append(f"the background is {scene.background}, not {claims.background}")
    return wrong
