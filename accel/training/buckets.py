"""Length buckets: pad variable-length batches to a few fixed sizes.

XLA compiles one graph per distinct tensor shape. Text batches padded to their longest
sequence have a new length almost every step, so a TPU loop compiles a graph almost
every step (seconds to minutes each). Padding each batch further, to the smallest of a
few fixed *bucket* lengths that holds it, bounds the graphs at one per bucket; with
padding that the loss ignores (``labels`` padded with ``-100``, an attention mask
padded with ``0``) the loss is the unpadded one.

Pad on the host, before the batches reach the device::

    from accel.training.buckets import bucketed, power_of_two_buckets

    sizes = power_of_two_buckets(256, smallest=32)  # (32, 64, 128, 256)
    pad = {"input_ids": 0, "attention_mask": 0, "labels": -100}
    for batch in acc.device_loader(bucketed(loader, sizes, pad)):
        ...

or inside the ``DataLoader``: ``collate_fn=BucketCollate(sizes, pad, collate_fn=...)``.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import torch
from torch.utils.data import default_collate

from accel.errors import AcceleratorTypeError, AcceleratorValueError

if TYPE_CHECKING:
    import torch

__all__ = ["BucketCollate", "bucketed", "pad_to_bucket", "power_of_two_buckets"]

#: What a pad value may be: a number every padded element gets.
PadValue = int | float | bool
_HOW: Final = (
    "pad_values names the tensors to pad: a mapping of the batch's keys (a dict batch) "
    "or a sequence with one entry per item, None for an item left as it is (a tuple "
    "or list batch)"
)


def power_of_two_buckets(longest: int, *, smallest: int = 16) -> tuple[int, ...]:
    """Bucket lengths ``smallest, 2 * smallest, ...`` up to the first that holds ``longest``.

    ``power_of_two_buckets(256, smallest=32)`` is ``(32, 64, 128, 256)``; padding wastes
    at most half of each batch, and the number of graphs grows with the logarithm of
    the longest length.

    :raises ValueError: ``longest`` or ``smallest`` is not a positive int.
    """
    for name, value in (("longest", longest), ("smallest", smallest)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AcceleratorValueError(
                f"power_of_two_buckets: {name} must be an int >= 1, got {value!r}"
            )
    sizes = [smallest]
    while sizes[-1] < longest:
        sizes.append(sizes[-1] * 2)
    return tuple(sizes)


def bucket_length(length: int, sizes: Sequence[int]) -> int:
    """The smallest of ``sizes`` that holds ``length``.

    :raises ValueError: ``sizes`` is empty, unsorted or not positive ints, or
        ``length`` is longer than its largest.
    """
    checked = _checked_sizes(sizes)
    index = bisect.bisect_left(checked, length)
    if index == len(checked):
        raise AcceleratorValueError(
            f"a batch of length {length} is longer than the largest bucket ({checked[-1]}, "
            f"of {list(checked)}); add a bucket of at least {length}, or truncate the "
            f"sequences to {checked[-1]}"
        )
    return checked[index]


def pad_to_bucket(
    batch: Any,
    sizes: Sequence[int],
    pad_values: Mapping[Any, PadValue] | Sequence[PadValue | None],
    *,
    dim: int = -1,
) -> Any:
    """``batch`` with the tensors ``pad_values`` names padded at the end of ``dim`` to
    the smallest bucket in ``sizes`` that holds them.

    ``batch`` is a mapping (a tokenizer's output: ``pad_values={"input_ids": 0,
    "attention_mask": 0, "labels": -100}``) or a tuple/list (``pad_values=(0, -100)``,
    ``None`` for an item left alone). The named tensors must have the same length
    along ``dim``; everything else is passed through, and the container keeps its type.
    ``batch`` itself is not changed.

    :raises ValueError: the named tensors' lengths differ, one is longer than the
        largest bucket, or ``pad_values`` names something the batch lacks.
    :raises TypeError: ``pad_values`` does not fit the batch's kind, or names a value
        that is not a tensor.
    """
    checked = _checked_sizes(sizes)
    named = _named_tensors(batch, pad_values)
    lengths = {place: tensor.shape[dim] for place, (tensor, _) in named.items()}
    if len(set(lengths.values())) > 1:
        raise AcceleratorValueError(
            f"pad_to_bucket pads the named tensors to one length along dim {dim}, but their "
            f"lengths differ: {lengths}; pad them to a common length first (your collate "
            f"function), or name only the tensors of one sequence in pad_values"
        )
    if not lengths:
        return batch
    length = next(iter(lengths.values()))
    target = bucket_length(length, checked)
    if target == length:
        return batch
    padded = {place: _pad(tensor, target, dim, value) for place, (tensor, value) in named.items()}
    if isinstance(batch, Mapping):
        if isinstance(batch, dict):
            rebuilt = copy.copy(batch)  # keeps a dict subclass and its state
            rebuilt.update(padded)
            return rebuilt
        return type(batch)({**batch, **padded})  # type: ignore[call-arg]
    items = [padded.get(index, item) for index, item in enumerate(batch)]
    if type(batch) in (list, tuple):
        return type(batch)(items)
    if hasattr(batch, "_fields"):
        return type(batch)(*items)
    return type(batch)(items)


@final
class BucketCollate:
    """A ``DataLoader`` ``collate_fn``: ``collate_fn(samples)``, then
    :func:`pad_to_bucket`, in the loader's workers."""

    __slots__ = ("collate_fn", "dim", "pad_values", "sizes")

    def __init__(
        self,
        sizes: Sequence[int],
        pad_values: Mapping[Any, PadValue] | Sequence[PadValue | None],
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        dim: int = -1,
    ) -> None:
        #: The bucket lengths, ascending.
        self.sizes = _checked_sizes(sizes)
        #: What to pad and with what (see :func:`pad_to_bucket`).
        self.pad_values = pad_values
        #: The collate function run first (torch's ``default_collate`` when ``None``).
        self.collate_fn = collate_fn
        #: The dimension padded.
        self.dim = dim

    def __call__(self, samples: list[Any]) -> Any:
        collate = self.collate_fn
        if collate is None:
            collate = default_collate
        return pad_to_bucket(collate(samples), self.sizes, self.pad_values, dim=self.dim)


def bucketed(
    loader: Iterable[Any],
    sizes: Sequence[int],
    pad_values: Mapping[Any, PadValue] | Sequence[PadValue | None],
    *,
    dim: int = -1,
) -> BucketedLoader:
    """``loader``'s batches, each padded by :func:`pad_to_bucket`; iterable epoch
    after epoch, with ``loader``'s ``len()``. Wrap it in ``acc.device_loader``."""
    return BucketedLoader(loader, _checked_sizes(sizes), pad_values, dim)


@final
class BucketedLoader:
    """What :func:`bucketed` returns."""

    __slots__ = ("_dim", "_pad_values", "_sizes", "loader")

    def __init__(
        self,
        loader: Iterable[Any],
        sizes: tuple[int, ...],
        pad_values: Mapping[Any, PadValue] | Sequence[PadValue | None],
        dim: int,
    ) -> None:
        #: The loader whose batches are padded.
        self.loader = loader
        self._sizes = sizes
        self._pad_values = pad_values
        self._dim = dim

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield pad_to_bucket(batch, self._sizes, self._pad_values, dim=self._dim)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


def _checked_sizes(sizes: Sequence[int]) -> tuple[int, ...]:
    checked = tuple(sizes) if isinstance(sizes, Sequence) else ()
    if (
        not checked
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in checked)
        or list(checked) != sorted(set(checked))
    ):
        raise AcceleratorValueError(
            f"bucket sizes must be a non-empty, ascending sequence of distinct ints >= 1, "
            f"got {sizes!r}; e.g. power_of_two_buckets(512) = {power_of_two_buckets(512)}"
        )
    return checked


def _named_tensors(
    batch: Any, pad_values: Mapping[Any, PadValue] | Sequence[PadValue | None]
) -> dict[Any, tuple[torch.Tensor, PadValue]]:
    """place in ``batch`` -> (tensor there, its pad value), for each place named."""

    if isinstance(batch, Mapping) and isinstance(pad_values, Mapping):
        places: list[tuple[Any, PadValue]] = list(pad_values.items())
        missing = [key for key, _ in places if key not in batch]
        if missing:
            raise AcceleratorValueError(
                f"pad_to_bucket: pad_values names {missing}, which the batch lacks (its "
                f"keys: {list(batch)}); name only keys the batch has"
            )
        values = {key: batch[key] for key, _ in places}
    elif isinstance(batch, (tuple, list)) and _is_position_list(pad_values):
        sequence: Sequence[PadValue | None] = pad_values  # type: ignore[assignment]
        if len(sequence) != len(batch):
            raise AcceleratorValueError(
                f"pad_to_bucket: pad_values has {len(sequence)} entries for a batch of "
                f"{len(batch)} items; give one per item (None: leave it as it is)"
            )
        places = [(i, value) for i, value in enumerate(sequence) if value is not None]
        values = {i: batch[i] for i, _ in places}
    else:
        raise AcceleratorTypeError(
            f"pad_to_bucket got a {type(batch).__name__} batch and pad_values of type "
            f"{type(pad_values).__name__}; {_HOW}"
        )
    named: dict[Any, tuple[torch.Tensor, PadValue]] = {}
    for place, value in places:
        found = values[place]
        if not isinstance(found, torch.Tensor) or found.dim() == 0:
            held = "a scalar tensor" if isinstance(found, torch.Tensor) else type(found).__name__
            raise AcceleratorTypeError(
                f"pad_to_bucket: pad_values names {place!r}, which holds {held}, not a "
                f"tensor with a sequence dimension; {_HOW}"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AcceleratorTypeError(
                f"pad_to_bucket: the pad value for {place!r} must be a number, got "
                f"{type(value).__name__}"
            )
        named[place] = (found, value)
    return named


def _is_position_list(pad_values: object) -> bool:
    return isinstance(pad_values, (tuple, list))


def _pad(tensor: torch.Tensor, length: int, dim: int, value: PadValue) -> torch.Tensor:
    shape = list(tensor.shape)
    missing = length - shape[dim]
    shape[dim] = missing
    filler = torch.full(shape, value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat((tensor, filler), dim=dim)
