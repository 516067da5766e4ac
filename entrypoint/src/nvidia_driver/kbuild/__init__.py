"""The runtime build: kernel trees and their providers, the compiler choice, patches, make,
packages, and the one pipeline that ties them together (pipeline.py).
"""
