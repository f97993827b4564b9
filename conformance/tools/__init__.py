"""Small programs the suite hands to the library (run as executables, not imported by the suite)."""
