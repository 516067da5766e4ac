"""The two kinds of NVIDIA kernel modules, and where each one's sources are in the driver package.

Which one a node gets is node/moduletype.py's choice; a build takes it as given.
"""

OPEN = "open"
PROPRIETARY = "proprietary"
SOURCE_DIRS = {OPEN: "kernel-open", PROPRIETARY: "kernel"}
