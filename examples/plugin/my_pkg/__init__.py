"""An example anysoftmax backend plugin (the README's "Add a backend")."""
