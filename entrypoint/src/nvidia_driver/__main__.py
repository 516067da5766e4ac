import sys

from nvidia_driver.cli import main

sys.exit(main())
