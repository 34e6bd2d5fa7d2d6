"""The foundations every layer stands on; they import nothing of robusttune above them.

- `registry`    `Registry` (a name -> an entry, ``@REGISTRY.register``) and `SpecError`, the one-line
                configuration error every command prints with exit code 2
- `registries`  the registries a RunSpec names: AGGREGATORS, ATTACKS, ALGORITHMS, DATASETS, MODELS
                (each fills itself from the layer that holds its entries, at its first lookup)
- `plugins`     the user's own entries: files, modules, entry points, on every worker
- `validation`  checked value types and pydantic's errors as one `SpecError` line (`Checked`)
- `schema`      the pydantic schema of a run's keys (`RunSchema`, RUNSPEC_KEYS), each documented
- `runspec`     `RunSpec`: one federated run, every key resolved (method = algorithm + rule)
- `records`     `RoundRecord`, `RunSummary`: what a run reports, and the collapse verdict
- `numerics`    portable or native float paths: the same bits on every CPU
- `files`       atomic writes; `yaml_input`: YAML files and ``--set KEY=VALUE``
"""
