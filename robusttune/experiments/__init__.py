"""Many runs: the commands' logic above one run.

- `sweep`        a search-space YAML as one Ray Tune experiment, every trial one run; and
                 `TuneStreamRunner`, the streaming Tune experiment the other experiments use
- `breakdown`    breakdown maps: bisection of every cell's Byzantine fraction, its report, horizon
- `calibration`  the trim sweep of a deployment against the worst case
- `tuning`       robust tuning: an Optuna study of a defence's knobs against the worst case
"""
