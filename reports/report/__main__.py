"""`python -m reports.report`: the same command as `twinfer report`."""

import sys

from reports.report.command import main

sys.exit(main())
