"""The bridge: the operations the JVM connector calls in the Python brain (see ``_server``)."""
