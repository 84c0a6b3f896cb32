"""Launchers: ``tfelastic-run`` (one node) and ``tensorflowrun`` (many hosts from a discovery script)."""
