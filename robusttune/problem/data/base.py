"""The dataset contract: the registry, a whole normalised dataset (``RawDataset``), one run's
federated split (``FederatedData``) and the seeded random streams every draw here comes from."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from robusttune.core.registries import DATASETS as DATASETS  # the datasets register here


@dataclass(frozen=True)
class RawDataset:
    """A whole dataset, normalised: float32 inputs, int64 labels in [0, num_classes), CPU tensors.

    Instances are cached and shared by every run of the process: treat the tensors as read-only.
    """

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int


@dataclass(frozen=True)
class DataShape:
    """What a dataset puts on a run's device, known without loading it: one input's shape, the
    number of classes and of inputs (training and held-out together). A dataset declares it when
    it registers (``DATASETS.register(name, data_shape=DataShape(...))``, or a function of the
    RunSpec where the shape is a knob), so a driver can size a run before any trial loads it
    (`robusttune.problem.footprint`)."""

    input_shape: tuple[int, ...]
    num_classes: int
    samples: int


@dataclass(frozen=True)
class FederatedData:
    """One run's data on its device: the clients' shards, the held-out set split into a test and
    a validation part (``validation_fraction``, `robusttune.problem.data.partition.validation_split`;
    the validation part is empty at 0), and the server root set.

    ``client_x[i]`` are views into one block holding the training set in client order (one copy on
    the device, not one per client); the test tensors may be shared with the in-process cache.
    Treat all of them as read-only (an attack that poisons labels works on a copy).
    """

    num_classes: int
    input_shape: tuple[int, ...]
    client_x: list[Tensor]
    client_y: list[Tensor]
    test_x: Tensor
    test_y: Tensor
    root_x: Tensor
    root_y: Tensor
    validation_x: Tensor | None = None
    validation_y: Tensor | None = None

    @property
    def client_sizes(self) -> list[int]:
        return [int(y.shape[0]) for y in self.client_y]


# --------------------------------------------------------------------------------------------
# Seeding
# --------------------------------------------------------------------------------------------

# Independent streams derived from the one partition seed, so that e.g. changing the root-set size
# does not change the partition, and changing synthetic_samples does not change the class means.
STREAM_PARTITION = 0
STREAM_ROOT = 1
STREAM_SYNTH_MEANS = 2
STREAM_SYNTH_TRAIN = 3
STREAM_SYNTH_TEST = 4
STREAM_VALIDATION = 5
STREAM_TRAIN_SUBSET = 6


def seeded_rng(seed: int, stream: int) -> np.random.Generator:
    """A numpy generator for (seed, stream); negative seeds are mapped into [0, 2^64)."""
    return np.random.default_rng([stream, int(seed) % 2**64])
