"""The controller's harness: options and set-up checks, the selected pytest run, the property driver, the
crash/hang budget.  Importing this package is cheap (the pytest entry point imports its options module)."""
