"""The batched reward model: one dual encoder on one device serving every CLIP-family term.

Image embeddings come from `embeds/<key>.h5` (computed once per dataset by features.extract and
checked against the model's fingerprint). Text embeddings are computed for unique strings only,
in length-sorted micro-batches bounded by a token budget, each trimmed to its longest sequence;
reference and noun embeddings are kept in an LRU cache because they recur every epoch.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from features.clip_models.factory import RewardModel
from features.store import FeatureReader
from plumbing.errors import ConfigError, DataError


class LruCache:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()

    def get(self, key: str) -> torch.Tensor | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: str, value: torch.Tensor) -> None:
        if self.capacity <= 0:
            return
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


class ImageEmbeddings:
    """An embeds file held in memory as one [N, d] tensor; rows looked up by image id."""

    def __init__(self, path: str | Path, model: RewardModel, device: torch.device):
        if not path:
            raise ConfigError(f"reward model {model.name}: 'embeds' (embeds/<key>.h5 from features.extract) "
                              "is required")
        reader = FeatureReader(path)
        have = reader.attrs.get("fingerprint")
        if have != model.fingerprint:
            raise DataError(f"{path}: image embeddings from another model (fingerprint {have!r}, this "
                            f"{model.name} {model.fingerprint!r}); re-run features.extract for this model")
        if "image" not in reader.names:
            raise DataError(f"{path}: no 'image' dataset; is this a feats.h5 instead of an embeds file?")
        self.path = Path(path)
        self.row_of = reader.row_of
        self.table = torch.from_numpy(reader.get_many("image", list(reader.row_of))).float().to(device)
        self.table = F.normalize(self.table, dim=-1)

    def __call__(self, image_ids: Sequence[int]) -> torch.Tensor:
        try:
            rows = [self.row_of[int(i)] for i in image_ids]
        except KeyError as exc:
            raise DataError(f"{self.path}: no image embedding for image id {exc.args[0]}") from None
        return self.table[torch.tensor(rows, device=self.table.device)]


class EmbeddingScorer:
    def __init__(self, model: RewardModel, embeds: str | Path | None, precision: str = "auto",
                 token_budget: int = 8192, cache_size: int = 100_000):
        self.model = model
        self.device = model.device
        self.images = ImageEmbeddings(embeds, model, self.device) if embeds is not None else None
        self.autocast_dtype = _autocast_dtype(precision, self.device)
        self.token_budget = max(token_budget, model.context_length)
        self.cache = LruCache(cache_size)
        self.texts_encoded = 0  # forward passes' rows, for benchmarks and logs

    @property
    def truncated(self) -> int:
        return self.model.tokenizer.truncated

    def image_embeddings(self, image_ids: Sequence[int]) -> torch.Tensor:
        if self.images is None:
            raise ConfigError(f"reward model {self.model.name}: no embeds file configured")
        return self.images(image_ids)

    @torch.no_grad()
    def text_embeddings(self, texts: Sequence[str], cached: Iterable[str] = ()) -> dict[str, torch.Tensor]:
        """Normalised embeddings of the unique `texts`; those also in `cached` go through the LRU."""
        cacheable = set(cached)
        out: dict[str, torch.Tensor] = {}
        todo = []
        for text in dict.fromkeys(texts):
            hit = self.cache.get(text) if text in cacheable else None
            if hit is None:
                todo.append(text)
            else:
                out[text] = hit
        if todo:
            for text, vector in zip(todo, self._encode(todo), strict=True):
                out[text] = vector
                if text in cacheable:
                    self.cache.put(text, vector)
        return out

    def _encode(self, texts: list[str]) -> torch.Tensor:
        token_ids = self.model.tokenizer.ids(texts)
        order = sorted(range(len(texts)), key=lambda i: len(token_ids[i]))
        chunks = []
        for rows in self._micro_batches(order, token_ids):
            tokens = self.model.tokenizer.padded([token_ids[i] for i in rows]).to(self.device)
            with self._autocast():
                chunks.append((rows, F.normalize(self.model.encode_tokens(tokens).float(), dim=-1)))
            self.texts_encoded += len(rows)
        dim = chunks[0][1].shape[1]
        result = torch.empty(len(texts), dim, device=self.device)
        for rows, vectors in chunks:
            result[torch.tensor(rows, device=self.device)] = vectors
        return result

    def _micro_batches(self, order: list[int], token_ids: list[list[int]]) -> Iterator[list[int]]:
        """Rows sorted by length; a batch closes when rows × its longest would pass the budget."""
        batch: list[int] = []
        for row in order:
            longest = len(token_ids[row])  # sorted ascending: the newest row is the longest
            if batch and (len(batch) + 1) * longest > self.token_budget:
                yield batch
                batch = []
            batch.append(row)
        if batch:
            yield batch

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision in ("auto", "fp16"):
        return torch.float16 if device.type == "cuda" else torch.bfloat16
    if precision == "bf16":
        return torch.bfloat16
    raise ConfigError(f"precision must be auto, fp32, fp16 or bf16, got {precision!r}")
