"""Readers of the formats a build unpacks: tar streams, ELF and kernel images.

Each is bounded (limits.py), raises only DriverError, and knows nothing of Flatcar or NVIDIA:
the callers in kbuild/ and sources/ say what a file is and where it comes from.
"""
