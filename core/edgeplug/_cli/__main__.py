import sys

from edgeplug._cli.app import main

sys.exit(main())
