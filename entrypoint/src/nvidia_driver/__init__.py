"""The ``nvidia-driver`` entrypoint of the Flatcar NVIDIA driver container images."""

__version__ = "0.1.0"
