"""The `aiayn` sub-commands, one module each (see aiayn/cli.py)."""
