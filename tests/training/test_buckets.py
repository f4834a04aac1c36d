"""Length buckets: batches padded to a few sizes with the caller's pad values, the
masked loss unchanged, on the CPU and through a third-party accelerator's loader."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader

from accel.training.buckets import (
    BucketCollate,
    bucket_length,
    bucketed,
    pad_to_bucket,
    power_of_two_buckets,
)
from helpers.bucket_training import PAD, TinyTokenModel, masked_loss, token_batch
from helpers.registries import isolated_registry
from helpers.training_fakes import BareAccelerator

SIZES = (32, 64, 128, 256)


class Example(NamedTuple):
    tokens: torch.Tensor
    targets: torch.Tensor
    weight: torch.Tensor


def test_power_of_two_buckets_cover_the_longest_length() -> None:
    assert power_of_two_buckets(256, smallest=32) == SIZES
    assert power_of_two_buckets(257, smallest=32) == (*SIZES, 512)
    assert power_of_two_buckets(5) == (16,)


@pytest.mark.parametrize(("length", "bucket"), [(1, 32), (32, 32), (33, 64), (200, 256)])
def test_bucket_length_is_the_smallest_bucket_that_holds_the_length(
    length: int, bucket: int
) -> None:
    assert bucket_length(length, SIZES) == bucket


def test_a_dict_batch_is_padded_with_each_tensors_own_pad_value() -> None:
    batch = token_batch(40)
    batch["weight"] = torch.ones(4)  # not named: passed through
    padded = pad_to_bucket(batch, SIZES, PAD)
    assert list(padded) == list(batch)
    assert {key: tuple(padded[key].shape) for key in PAD} == dict.fromkeys(PAD, (4, 64))
    assert padded["weight"] is batch["weight"]
    for key, value in PAD.items():
        assert torch.equal(padded[key][:, :40], batch[key])
        assert (padded[key][:, 40:] == value).all()
        assert padded[key].dtype == batch[key].dtype
    assert batch["input_ids"].shape == (4, 40), "the input batch must not change"


def test_a_batch_already_at_a_bucket_length_comes_back_as_it_is() -> None:
    batch = token_batch(64)
    assert pad_to_bucket(batch, SIZES, PAD) is batch


def test_tuples_namedtuples_and_mapping_subclasses_keep_their_type() -> None:
    example = Example(torch.ones(2, 5), torch.zeros(2, 5), torch.ones(2))
    padded = pad_to_bucket(example, (8,), (0, -100, None))
    assert type(padded) is Example and padded.tokens.shape == (2, 8)
    assert padded.targets[:, 5:].eq(-100).all() and padded.weight is example.weight
    plain = pad_to_bucket((torch.ones(5), 3), (8,), (0, None))
    assert type(plain) is tuple and plain[0].shape == (8,) and plain[1] == 3
    ordered = pad_to_bucket(OrderedDict(x=torch.ones(3, 2)), (4,), {"x": 7}, dim=0)
    assert type(ordered) is OrderedDict and ordered["x"].shape == (4, 2)
    assert ordered["x"][3].tolist() == [7.0, 7.0]


def test_the_masked_loss_of_a_padded_batch_is_the_unpadded_loss() -> None:
    torch.manual_seed(0)
    model = TinyTokenModel()
    for length in (8, 37, 100, 255):
        batch = token_batch(length)
        padded = pad_to_bucket(batch, SIZES, PAD)
        assert padded["input_ids"].shape[1] == bucket_length(length, SIZES)
        torch.testing.assert_close(masked_loss(model, padded), masked_loss(model, batch))


def test_bucket_collate_pads_inside_the_dataloader() -> None:
    def collate(samples: list[int]) -> dict[str, torch.Tensor]:
        return token_batch(max(samples), size=len(samples))

    loader = DataLoader(
        [5, 9, 40, 70], batch_size=2, collate_fn=BucketCollate(SIZES, PAD, collate_fn=collate)
    )
    assert [batch["labels"].shape[1] for batch in loader] == [32, 128]
    default = BucketCollate((4,), (0,))
    assert default([(torch.ones(3),), (torch.ones(3),)])[0].tolist() == [[1, 1, 1, 0]] * 2


def test_bucketed_loaders_repeat_have_a_length_and_feed_a_third_party_accelerator() -> None:
    batches = [token_batch(n) for n in (10, 50, 33)]
    acc = isolated_registry(BareAccelerator()).get_accelerator("bare")
    loader = acc.device_loader(bucketed(batches, SIZES, PAD))
    assert len(loader) == 3
    for _epoch in range(2):
        assert [b["input_ids"].shape[1] for b in loader] == [32, 64, 64]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: bucket_length(300, SIZES), ValueError, "longer than the largest bucket"),
        (lambda: bucket_length(3, (64, 32)), ValueError, "ascending sequence of distinct"),
        (lambda: bucket_length(3, ()), ValueError, "non-empty"),
        (lambda: power_of_two_buckets(0), ValueError, "longest must be an int >= 1"),
        (
            lambda: pad_to_bucket(
                {"a": torch.ones(1, 3), "b": torch.ones(1, 4)}, SIZES, {"a": 0, "b": 0}
            ),
            ValueError,
            "lengths differ",
        ),
        (
            lambda: pad_to_bucket({"a": torch.ones(3)}, SIZES, {"b": 0}),
            ValueError,
            "which the batch lacks",
        ),
        (
            lambda: pad_to_bucket((torch.ones(3),), SIZES, {"a": 0}),
            TypeError,
            "pad_values names the tensors",
        ),
        (
            lambda: pad_to_bucket((torch.ones(3),), SIZES, (0, 0)),
            ValueError,
            "2 entries for a batch of 1",
        ),
        (lambda: pad_to_bucket({"a": 3}, SIZES, {"a": 0}), TypeError, "which holds int"),
        (
            lambda: pad_to_bucket({"a": torch.ones(3)}, SIZES, {"a": "x"}),
            TypeError,
            "must be a number",
        ),
    ],
)
def test_bad_bucket_inputs_say_what_to_do(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()
