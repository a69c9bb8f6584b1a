"""The offline world's vocabulary: shapes, colors, sizes, textures, places and relations.

Each attribute value has a canonical name (what scenes.json records) and the words captions
may use for it. Parsers read caption text through these tables, never through the caption
templates, so a parse is an independent check of what a caption says.
"""

from __future__ import annotations

SHAPES: dict[str, tuple[str, ...]] = {
    "circle": ("circle", "disc", "disk"),
    "square": ("square",),
    "triangle": ("triangle",),
    "diamond": ("diamond", "rhombus"),
    "star": ("star",),
    "hexagon": ("hexagon",),
    "cross": ("cross", "plus"),
}

# RGB values keep every color far from the others and from every background.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (35, 70, 225),
    "yellow": (245, 220, 30),
    "purple": (140, 40, 180),
    "orange": (250, 130, 20),
    "white": (250, 250, 250),
    "black": (15, 15, 15),
}
COLOR_WORDS: dict[str, tuple[str, ...]] = {name: (name,) for name in COLORS}
COLOR_WORDS["purple"] = ("purple", "violet")

SIZES: dict[str, float] = {"small": 0.19, "large": 0.33}  # shape diameter / image side
SIZE_WORDS: dict[str, tuple[str, ...]] = {"small": ("small", "little", "tiny"), "large": ("large", "big")}

TEXTURES: tuple[str, ...] = ("solid", "striped", "checkered")
TEXTURE_WORDS: dict[str, tuple[str, ...]] = {
    "solid": ("solid", "plain"),
    "striped": ("striped",),
    "checkered": ("checkered",),
}

BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "gray": (128, 128, 128),
    "tan": (170, 145, 110),
    "teal": (70, 125, 125),
    "slate": (95, 105, 135),
    "olive": (120, 125, 75),
}

# Grid cells (row, col) of a 3x3 split of the image, named as captions name them.
PLACES: dict[tuple[int, int], str] = {
    (0, 0): "top left", (0, 1): "top", (0, 2): "top right",
    (1, 0): "left", (1, 1): "center", (1, 2): "right",
    (2, 0): "bottom left", (2, 1): "bottom", (2, 2): "bottom right",
}

# Relation of subject to object; `inverse` gives the relation seen from the other side.
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
INVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
RELATION_PHRASES: dict[str, tuple[str, ...]] = {
    "left of": ("to the left of", "left of"),
    "right of": ("to the right of", "right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}

NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}


def word_index(table: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """word -> canonical name, for parsing."""
    return {word: name for name, words in table.items() for word in words}


def plural(word: str) -> str:
    """The world's plural of a shape word: "cross" -> "crosses", "star" -> "stars"."""
    return word + ("es" if word.endswith(("s", "x")) else "s")


def shape_word_index() -> dict[str, str]:
    """Every shape word, singular then plural -> its canonical shape."""
    singular = word_index(SHAPES)
    return {**singular, **{plural(word): shape for word, shape in singular.items()}}
