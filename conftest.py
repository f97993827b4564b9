"""Makes the conformance plugin active when pytest runs from a checkout (installed suites use the entry point)."""

pytest_plugins = ["conformance.plugin"]
