"""``python -m xmatch`` (and ``torchrun -m xmatch train ...``) runs the command line."""

import sys

from xmatch.cli.main import main

sys.exit(main())
