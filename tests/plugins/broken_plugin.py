"""A matrix `plugins:` module: importing it registers the broken test backends (in the matrix's
worker processes too), as a plugin's module registers its backends."""

from broken_backends import register_all

register_all()
