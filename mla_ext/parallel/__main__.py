"""``python -m mla_ext.parallel --cp N ...`` (see :mod:`mla_ext.parallel.runner`)."""
import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main())
