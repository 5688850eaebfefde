"""The base pieces every layer of the library uses: errors, path rules and versioned documents.

:mod:`errors` (one exception hierarchy), :mod:`paths` (validated storage paths) and
:mod:`formats` (JSON documents with a kind and a version). Imports nothing else of sparkguard.
"""
