import sys

from dynaresize.cli import main

sys.exit(main())
