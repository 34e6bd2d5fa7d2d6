"""``python -m robusttune``: the command line, as the ``robusttune`` script runs it."""

from robusttune.commands.cli import main

if __name__ == "__main__":
    main()
