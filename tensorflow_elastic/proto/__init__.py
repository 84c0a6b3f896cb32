"""Protocol buffer definitions; the Python modules are generated at install time (tools/gen_protos.py)."""
