"""One federated run.

- `simulation`        `Simulation`: the round loop (sample, train, attack, aggregate, evaluate)
- `input_statistics`  what the rule was given: the honest inputs' spread, the aggregation error
- `recording`         the run folder: rounds.csv, summary.json, TensorBoard scalars
- `runners`           `Runner`: RunSpecs -> RunSummaries; `InProcessRunner` runs them here
"""
