"""`python -m ferry ...`: the same as the `ferry` command (ferry/_cli.py)."""
from ._cli import main

if __name__ == "__main__":
    main()
