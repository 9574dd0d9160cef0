"""A matrix `plugins:` module: importing it registers the broken test backends (in workers too)."""

from matrix_broken_backends import register_all

register_all()
