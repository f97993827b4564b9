"""Reports of a run (controller side): ``report`` builds and writes ``conformance.json`` / ``.md`` and the terminal
summary; ``gate`` compares a run with a baseline report (the version gate)."""
