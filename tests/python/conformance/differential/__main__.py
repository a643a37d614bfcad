"""`python3 -m tests.python.conformance.differential ...`: runs cli.main."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
