import sys

from kvstate.impl_mutants.cli import main

sys.exit(main())
