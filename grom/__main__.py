import sys

from grom.cli import main

sys.exit(main())
