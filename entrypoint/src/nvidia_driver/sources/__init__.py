"""Where a build's inputs come from: Flatcar's release facts and its release server, bounded and
verified downloads (DIGESTS, signatures, Flatcar's signing key), and NVIDIA's redist archives.

Nothing here builds or installs on a node: kbuild/, node/ and image/ use these.
"""
