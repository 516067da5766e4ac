"""The reboot gate: a Flatcar node reboots into a staged release only once its driver image can
serve it (``nvidia-driver reboot-gate``; docs/gpu-operator.md, "The reboot gate").

It reads the staged release from the reboot manager (FLUO's agent, or update_engine for kured),
works out from the ClusterPolicy or NVIDIADriver which images the GPU Operator will ask for on
that release, checks the registry for them (and, for the build image, that it can build for the
release's kernel), and holds the reboot, with one line saying why, until they are there.
"""
