"""The command line: `cli` is the typer app (``robusttune``); a command with logic of its own has
its module beside it: `sweep`, `breakdown`, `tune`, `horizon`; `trial_runner` picks the runner
(Ray Tune or in process) every experiment command drives."""
