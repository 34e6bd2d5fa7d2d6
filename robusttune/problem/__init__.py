"""The learning problem and the federation it is split over.

- `data`            datasets (registry DATASETS), their split over clients, validation and test parts
- `models`          models (registry MODELS) and the flat-vector view of their parameters
- `training`        the sampled clients' local SGD (sequential, or batched with torch.func)
- `sampling`        who takes part in a round (fixed-size or Bernoulli participation)
- `byzantine_law`   the law of a round's Byzantine share: P(majority), P(the trim is exceeded)
"""
