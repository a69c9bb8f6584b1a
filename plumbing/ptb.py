"""Caption normalisation equal to pycocoevalcap's PTBTokenizer, in pure Python.

pycocoevalcap runs Stanford's PTBTokenizer 3.4.1 (`-preserveLines -lowerCase`) and then drops
the tokens in PUNCTUATIONS. This module reproduces that output for caption text without
starting Java; `plumbing.ptb_java` keeps the Java path available. Agreement with the Java
tokenizer is measured on real COCO captions by the tests and the ngram benchmark.

Quirks kept on purpose because the reference has them: brackets become `-lrb-`/`-rrb-` after
lower-casing and so survive the (upper-case) punctuation filter; an abbreviation that ends a
line gets an extra "." token; a run of "!" and "?" ("wow!!", "?!") is one token the filter keeps.

Text beyond plain ASCII is normalised as the Java lexer does (checked against it in the tests):
curly and angle quotes become quote tokens, long dashes "--", "…" "...", € $, £ #, ¢ "cents",
½ "1/2"; symbols (+ = × ° © ™ ★ → ...) stand alone; emoji, control and zero-width characters
separate words; a soft hyphen vanishes. Emoticons, web addresses, hashtags, "AT&T", "'90s",
"'n'", SGML tags and entities ("&amp;") follow the lexer's rules too. Still different, and rare:
a quote character inside a word ("ma’n"), two quote characters side by side, "'tis", a web
address glued to a word. Where those matter, `--tokenizer java` runs pycocoevalcap's tokenizer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

# Exactly the tokens pycocoevalcap removes after tokenising.
PUNCTUATIONS = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-", ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)
_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_ABBREVIATIONS = frozenset(
    ["mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "inc", "ltd", "co", "corp", "mt", "ft", "jan", "feb",
     "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "ave", "blvd", "rd", "gen", "gov", "sgt",
     "capt", "lt", "col", "prof", "rev", "messrs"]
)
_CONTRACTIONS = ("n't", "'s", "'re", "'ve", "'ll", "'d", "'m")
_SPECIAL = {"cannot": 3, "gonna": 3, "gotta": 3, "wanna": 3}  # split after this many letters

# Pieces that always become tokens of their own, wherever they occur.
_SPLIT = re.compile(r"""(\.\.\.|--|[!?]{2,}|(?<!\d)[,:]|[,:](?!\d)|[;!?(){}\[\]"&#$%*+=^~|\\<>]|``|'')""")

# Characters the Java lexer rewrites (curly and angle quotes, long dashes, currency, fractions).
_NORMALISED = str.maketrans({
    "\u201c": " `` ", "\u201d": " '' ", "\u00ab": " `` ", "\u00bb": " '' ", "\u2039": " ` ", "\u203a": " ' ",
    "\u2018": " ` ", "\u2019": "'", "\u2012": " -- ", "\u2013": " -- ", "\u2014": " -- ", "\u2015": " -- ",
    "\u2026": " ... ", "\u20ac": " $ ", "\u00a4": " $ ", "\u00a3": " # ", "\u00a2": " cents ",
    "\u00bd": " 1/2 ", "\u00bc": " 1/4 ", "\u00be": " 3/4 ", "\u00ad": "",
})
# Pieces the Java lexer keeps whole, found before anything else is split: emoticons (":)", ";-(",
# ":D", ">:(", ":']"; not ":o" or ":/"), web addresses, hashtags, capitals joined by "&" ("AT&T"),
# decades ("'90s"), "'n'" and SGML tags ("<b>", "</a>").
_WHOLE = re.compile("(" + "|".join([
    r"""(?<![A-Za-z0-9])https?://[^\s<>"]*[^\s<>".,;:!?)\]}']""",
    r">?[:;=]['-]?[()\[\]DPdpO|](?![A-Za-z0-9])",
    r"(?<![0-9&#])#[A-Za-z]+",
    r"(?<![A-Za-z])[A-Z]+(?:&[A-Z]+)+",
    r"'(?:\d\ds|n')",
    r"</?[A-Za-z][^<>]*>",
]) + ")")
_MAYBE_WHOLE = re.compile(r"[:;=#&<>]|'[\dn]|http")  # a cheap test that most captions fail
_ENTITIES = {"&amp;": "&", "&lt;": "<", "&gt;": ">", "&quot;": '"'}
_ENTITY = re.compile("|".join(_ENTITIES))
# What printable ASCII never holds: the text `_java_char` then reads one character at a time.
_UNUSUAL = re.compile(r"[^\x20-\x7e]")
# Punctuation beyond ASCII that stands alone like a symbol (Unicode S* and No); ASCII is `_SPLIT`'s.
_LONE_PUNCTUATION = frozenset("\u201e\u201a\u00b7\u00a7\u00b6\u2030\u2032\u2033\u00bf\u00a1\u2022")


def ptb_tokens(text: str) -> list[str]:
    """PTBTokenizer tokens of one caption, lowercased, before the punctuation filter."""
    if "&" in text:
        text = _ENTITY.sub(lambda entity: _ENTITIES[entity.group()], text)
    pieces = _WHOLE.split(text) if _MAYBE_WHOLE.search(text) else [text]  # odd places: pieces kept whole
    tokens = [t for k, piece in enumerate(pieces) for t in (_whole_token(piece) if k % 2 else _split_text(piece))]
    if tokens and _is_abbreviation(tokens[-1]):
        tokens.append(".")  # a line-final abbreviation also ends the sentence
    return [_token_text(t) for t in tokens]


def _whole_token(piece: str) -> list[str]:
    """One token; an emoticon's round brackets spelled as the lexer spells them, a tag's spaces
    made non-breaking as the lexer prints them."""
    return [piece.replace("(", "-LRB-").replace(")", "-RRB-").replace(" ", "\u00a0")]


def _split_text(text: str) -> list[str]:
    if _UNUSUAL.search(text):
        text = "".join(map(_java_char, text.translate(_NORMALISED)))
    return [token for chunk in _SPLIT.sub(r" \1 ", re.sub(r"\s+", " ", text)).split() for token in _split_chunk(chunk)]


def _java_char(char: str) -> str:
    """What the Java lexer makes of one character that `_NORMALISED` leaves: a separator for what it
    cannot tokenise (outside the Basic Multilingual Plane, controls, zero-width and other format
    characters), a token of its own for a symbol, else the character."""
    if " " <= char <= "~":  # printable ASCII: `_SPLIT` splits what stands alone
        return char
    category = unicodedata.category(char)
    if ord(char) > 0xFFFF or category in ("Cc", "Cf") and not char.isspace():
        return " "
    if category[0] == "S" or category == "No" or char in _LONE_PUNCTUATION:
        return f" {char} "
    return char


def ptb_tokenize(text: str) -> str:
    """One caption -> pycocoevalcap's tokenised string (lowercase, punctuation tokens removed)."""
    return " ".join(t for t in ptb_tokens(text) if t not in PUNCTUATIONS)


def ptb_tokenize_all(texts: Iterable[str]) -> list[str]:
    return [ptb_tokenize(t) for t in texts]


def _token_text(token: str) -> str:
    if token == '"':
        return "''"
    return _BRACKETS.get(token, token).lower()


def _split_chunk(chunk: str) -> list[str]:
    if _SPLIT.fullmatch(chunk) or chunk.lower() in _CONTRACTIONS:
        return [chunk]
    lead: list[str] = []
    while len(chunk) > 1 and chunk[0] in "'`-":
        lead.append("`" if chunk[0] != "-" else "-")
        chunk = chunk[1:]
    trail: list[str] = []
    while len(chunk) > 1:
        if chunk.endswith(".") and not _keeps_period(chunk):
            trail.insert(0, ".")
            chunk = chunk[:-1]
        elif chunk[-1] in "'-":
            trail.insert(0, chunk[-1])
            chunk = chunk[:-1]
        else:
            break
    return lead + _split_contraction(chunk) + trail


def _keeps_period(chunk: str) -> bool:
    stem = chunk[:-1]
    return _is_abbreviation(chunk) or bool(re.fullmatch(r"[A-Za-z]", stem)) or chunk == "."


def _is_abbreviation(token: str) -> bool:
    if not token.endswith(".") or len(token) < 2:
        return False
    stem = token[:-1].lower()
    return stem in _ABBREVIATIONS or bool(re.fullmatch(r"([a-z]\.)+[a-z]", stem))


def _split_contraction(word: str) -> list[str]:
    lower = word.lower()
    if lower in _SPECIAL:
        cut = _SPECIAL[lower]
        return [word[:cut], word[cut:]]
    for tail in _CONTRACTIONS:
        if lower.endswith(tail) and len(word) > len(tail):
            return [word[: -len(tail)], word[-len(tail):]]
    return [word]
