"""Draw a run's curves: ``python scripts/plot.py RUN_DIR [OUT.png]``."""

import sys

from pipeline.tools.plotting import plot_run

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python scripts/plot.py RUN_DIR [OUT.png]")
    print(plot_run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
