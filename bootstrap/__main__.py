import sys

from bootstrap.cli import main

sys.exit(main())
