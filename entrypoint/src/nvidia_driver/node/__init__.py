"""The driver on a node: host facts, the module type, module parameters and firmware, loading
modules, the daemons, the driver root, the lifecycle (init, load, unload), status and peermem.
"""
