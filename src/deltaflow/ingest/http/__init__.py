"""``deltaflow serve``: events POSTed over HTTP, group-committed into Delta tables."""
