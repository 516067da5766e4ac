"""What runs only at image build: fetching and installing the driver's .run and NVIDIA's redist
archives (provision.py), reading the .run and its .manifest, installing the userspace a headless
node needs, and checking the driver root against driver-root.toml. Nothing here runs on a node.
"""
