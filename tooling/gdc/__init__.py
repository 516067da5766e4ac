"""Build, push and publish tooling behind tasks.py."""
