"""`python -m suite.report FOLDER ...` (suite.report.cli)."""
import sys

from suite.report.cli import main

sys.exit(main())
