"""An example robusttune plugin: one rule, one attack, one dataset and one model, registered
with the same decorators as the tool's own (see ../README.md for the walk-through).

Name it as ``--plugin examples/my_defence/`` (a folder: the trailing / says so), in a YAML's
``plugins:`` list, or, once installed as a package, with the entry point
``[project.entry-points."robusttune.plugins"] my_defence = "my_defence"``.
"""

from . import arrays, meamed, sparse_spike  # noqa: F401  (importing them registers them)
